// Weight streaming for inference: the weights of a model's transformer blocks stay in host memory
// (loaded and prepared there once) and each pass copies them, a group of blocks at a time, into a
// small ring of device buffers, so that a model whose weights do not fit the device's budget (a
// ViT-g's 2.3 GB of fp16 weights against lavapipe's 2 GiB heap) still runs. The copies are
// recorded in the pass's command buffer: group g + 1's after group g's first layer, so that the
// device may copy it while group g computes.
#pragma once
#include <cstddef>

#include "compute/network.h"

namespace tessera {

// The plan's categories: the streamed weights in host memory (none of the device's heap where it
// imports host memory) and the ring slots they are copied into.
inline constexpr const char* kStreamedHostCategory = "streamed weights (host)";
inline constexpr const char* kStreamRingCategory = "streamed weights (ring)";

// The transformer blocks of the network (layers named "blocks.<i>."): 0 where it has none.
int stream_block_count(const Network& network);
// Block i in group i / blocks_per_group, the other layers resident; a ring of two slots (one
// where there is one group).
StreamGroups stream_groups(const Network& network, int blocks_per_group);

// Whether `spec` of layer `layer` stays in host memory: a parameter, state or prepared weight of a
// streamed layer (scratch and activations stay on the device).
bool is_streamed(const StreamGroups& streaming, size_t layer, const TensorSpec& spec);
// Adds the ring to `layout`: `slots` sets of buffers, the k-th of each as large as the k-th
// streamed tensor of any group, and each streamed tensor's place in its group's slot.
void place_stream_ring(GraphLayout& layout, const StreamGroups& streaming);
// Around layer `layer` of a prepared network's pass, where it is the first layer of group g:
// before it (after false) group 0's copies, for group 0; after it, group g + 1's. After: the
// first layer's read of the slot is what waits for group g's copies (a barrier that waits for
// every transfer before it), so group g + 1's, recorded after that, run on beside group g
// (vk::Recorder waits for compute only between dispatches).
void record_stream_uploads(vk::Recorder& recorder, const Network& network, size_t layer, bool after);

}  // namespace tessera
