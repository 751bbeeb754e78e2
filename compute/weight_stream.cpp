#include "compute/weight_stream.h"

#include <algorithm>
#include <string>
#include <string_view>

namespace tessera {

namespace {

// The block a layer belongs to ("blocks.7.attn.qkv": 7), or -1.
int block_of(const std::string& layer) {
  constexpr std::string_view prefix = "blocks.";
  if (layer.rfind(prefix, 0) != 0) return -1;
  size_t end = layer.find('.', prefix.size());
  if (end == std::string::npos || end == prefix.size()) return -1;
  int block = 0;
  for (size_t i = prefix.size(); i < end; ++i) {
    if (layer[i] < '0' || layer[i] > '9' || block > 1'000'000) return -1;
    block = block * 10 + (layer[i] - '0');
  }
  return block;
}

void record_group_upload(vk::Recorder& recorder, const Network& network, int group) {
  const StreamGroups& streaming = network.streaming();
  recorder.set_scope("stream group " + std::to_string(group));
  for (size_t l = 0; l < network.layers().size(); ++l) {
    if (streaming.group_of_layer[l] != group) continue;
    const Network::Layer& layer = network.layers()[l];
    for (size_t s = 0; s < layer.ring.size(); ++s)
      if (layer.ring[s]) recorder.copy(layer.tensors[s]->buffer(), 0, layer.ring[s]->buffer(), 0, layer.tensors[s]->bytes());
  }
}

}  // namespace

int stream_block_count(const Network& network) {
  int blocks = 0;
  for (auto& layer : network.layers())
    if (layer.from_model) blocks = std::max(blocks, block_of(layer.name) + 1);
  return blocks;
}

StreamGroups stream_groups(const Network& network, int blocks_per_group) {
  StreamGroups streaming;
  streaming.blocks_per_group = std::max(blocks_per_group, 1);
  for (auto& layer : network.layers()) {
    int block = layer.from_model ? block_of(layer.name) : -1;
    streaming.group_of_layer.push_back(block < 0 ? -1 : block / streaming.blocks_per_group);
    streaming.groups = std::max(streaming.groups, streaming.group_of_layer.back() + 1);
  }
  streaming.slots = std::min(streaming.groups, 2);
  return streaming;
}

bool is_streamed(const StreamGroups& streaming, size_t layer, const TensorSpec& spec) {
  return streaming.active() && streaming.group_of_layer[layer] >= 0 &&
         (in_checkpoint(spec.role) || spec.role == TensorRole::prepared);
}

void place_stream_ring(GraphLayout& layout, const StreamGroups& streaming) {
  if (!streaming.active()) return;
  // Each group's streamed tensors in layout order: blocks alike put alike tensors at one position.
  std::vector<std::vector<size_t>> members(static_cast<size_t>(streaming.groups));
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const GraphLayout::Placed& placed = layout.tensors[t];
    if (placed.kind == GraphLayout::Kind::tensor && layout.buffers[placed.buffer].category == kStreamedHostCategory)
      members[static_cast<size_t>(streaming.group_of_layer[placed.layer])].push_back(t);
  }
  std::vector<uint64_t> sizes;
  for (auto& group : members)
    for (size_t k = 0; k < group.size(); ++k) {
      if (sizes.size() <= k) sizes.push_back(0);
      sizes[k] = std::max(sizes[k], layout.buffers[layout.tensors[group[k]].buffer].bytes);
    }
  std::vector<size_t> first_buffer;
  for (int slot = 0; slot < streaming.slots; ++slot) {
    first_buffer.push_back(layout.buffers.size());
    for (uint64_t bytes : sizes)
      layout.buffers.push_back({"streamed weights slot " + std::to_string(slot), bytes, kStreamRingCategory});
  }
  for (size_t g = 0; g < members.size(); ++g)
    for (size_t k = 0; k < members[g].size(); ++k) {
      GraphLayout::Placed placed = layout.tensors[members[g][k]];
      placed.kind = GraphLayout::Kind::ring;
      placed.buffer = first_buffer[g % static_cast<size_t>(streaming.slots)] + k;
      layout.tensors.push_back(std::move(placed));
    }
}

void record_stream_uploads(vk::Recorder& recorder, const Network& network, size_t layer, bool after) {
  const StreamGroups& streaming = network.streaming();
  if (!streaming.active()) return;
  const int group = streaming.group_of_layer[layer];
  const auto& groups = streaming.group_of_layer;
  if (group < 0 || std::find(groups.begin(), groups.end(), group) != groups.begin() + static_cast<std::ptrdiff_t>(layer))
    return;  // not the group's first layer
  if (!after && group == 0) record_group_upload(recorder, network, 0);
  if (after && group + 1 < streaming.groups) record_group_upload(recorder, network, group + 1);
}

}  // namespace tessera
