// The graph's memory layout (Network::layout): the one walk over the layers that places every
// tensor in a buffer, which the memory plan sums and Network::allocate creates.
#include <algorithm>

#include "compute/network.h"
#include "compute/weight_stream.h"

namespace tessera {

MemoryPlan GraphLayout::plan(const vk::Allocator& allocator) const {
  MemoryPlan plan;
  for (auto& buffer : buffers) plan.add(allocator, buffer.category, buffer.bytes, buffer.usage, buffer.name);
  return plan;
}

GraphLayout Network::layout() const {
  GraphLayout layout;
  const bool reuse = !with_gradients_;
  std::vector<size_t> free;  // shared buffers no live tensor holds
  auto bytes_of = [](const GraphLayout::Placed& placed) {
    return (static_cast<uint64_t>(element_count(placed.shape)) * element_size(placed.dtype) + 3) / 4 * 4;
  };
  auto place = [&](GraphLayout::Placed placed, const std::string& category, bool shared,
                   vk::MemoryUsage usage = vk::MemoryUsage::device) {
    uint64_t bytes = bytes_of(placed);
    if (!shared) {
      layout.buffers.push_back({placed.name, bytes, category, usage});
      placed.buffer = layout.buffers.size() - 1;
    } else {
      // The smallest free buffer that holds it, else a new one: growing a small buffer for a
      // large tensor would leave two large ones where one was needed.
      auto best = free.end();
      for (auto it = free.begin(); it != free.end(); ++it)
        if (layout.buffers[*it].bytes >= bytes && (best == free.end() || layout.buffers[*it].bytes < layout.buffers[*best].bytes))
          best = it;
      if (best == free.end()) {
        layout.buffers.push_back({category + " (shared)", bytes, category});
        placed.buffer = layout.buffers.size() - 1;
      } else {
        placed.buffer = *best;
        free.erase(best);
        layout.buffers[placed.buffer].bytes = std::max(layout.buffers[placed.buffer].bytes, bytes);
      }
    }
    layout.tensors.push_back(std::move(placed));
    return layout.tensors.back().buffer;
  };
  // Pass scratch: a layer's passes run one after another, so the i-th such tensor of every layer
  // shares buffer i, named after the first tensor placed there.
  constexpr size_t unplaced = SIZE_MAX;
  std::vector<size_t> scratch_buffers;
  auto place_pass_scratch = [&](GraphLayout::Placed placed, size_t slot) {
    uint64_t bytes = bytes_of(placed);
    if (slot == scratch_buffers.size()) {
      layout.buffers.push_back({placed.name + " (scratch shared by layers)", bytes, "activations"});
      scratch_buffers.push_back(layout.buffers.size() - 1);
    }
    size_t buffer = scratch_buffers[slot];
    layout.buffers[buffer].bytes = std::max(layout.buffers[buffer].bytes, bytes);
    placed.buffer = buffer;
    layout.tensors.push_back(std::move(placed));
  };
  // The last layer that reads each layer's output; the network's output stays alive.
  std::vector<size_t> last_use(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    last_use[l] = l;
    for (int producer : layers_[l].inputs)
      if (producer >= 0) last_use[static_cast<size_t>(producer)] = l;
  }
  last_use.back() = layers_.size();
  std::vector<size_t> output_buffer(layers_.size(), unplaced);
  auto place_output = [&](size_t l) {
    const Layer& layer = layers_[l];
    output_buffer[l] =
        place({layer.name, layer.output_shape, layer.op->output_dtype(activations_), GraphLayout::Kind::output, l, 0},
              "activations", reuse);
  };
  // Inference passes run the inference fusion: a layer that computes a later layer's output
  // writes it while its own inputs are live, so that output is placed with the writer, and
  // what a fused layer would have written (its output, its saved tensors) is never placed.
  // Training places the fused layer's output and gradient, which its writer's passes use,
  // and neither of the writer's own.
  const std::vector<Fused>& fused = fusion_[false];
  const std::vector<Fused>& trained = fusion_[true];
  auto written = [&](size_t l) {
    return reuse ? !fused[l].skipped && fused[l].writes_output_of < 0 : trained[l].writes_output_of < 0;
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    std::vector<size_t> scratch;
    size_t scratch_slot = 0;
    for (size_t s = 0; s < layer.specs.size(); ++s) {
      const TensorSpec& spec = layer.specs[s];
      std::string full = tensor_name(layer.name, spec);
      const DType dtype = spec.activation_typed ? activations_ : spec.dtype;
      bool saved = spec.role == TensorRole::saved, prepared = spec.role == TensorRole::prepared;
      if ((saved || prepared) && reuse && fused[l].skipped) continue;
      if (spec.inference_only && !reuse) continue;  // bound as nullptr, never read
      if (spec.training_only && reuse) continue;
      // Inference keeps what prepare() wrote for every pass; training rewrites it each forward.
      std::string category = in_checkpoint(spec.role) ? "parameters"
                             : prepared && reuse      ? "prepared weights"
                                                      : "activations";
      if (spec.pass_scratch && !reuse) {
        place_pass_scratch({full, spec.shape, dtype, GraphLayout::Kind::tensor, l, s}, scratch_slot++);
        continue;
      }
      const bool streamed = reuse && is_streamed(streaming_, l, spec);
      size_t buffer = place({full, spec.shape, dtype, GraphLayout::Kind::tensor, l, s},
                            streamed ? kStreamedHostCategory : category, saved && reuse,
                            streamed ? vk::MemoryUsage::host : vk::MemoryUsage::device);
      if (saved && reuse) scratch.push_back(buffer);
      if (spec.role == TensorRole::parameter && with_gradients_)
        place({full + ".grad", spec.shape, DType::f32, GraphLayout::Kind::grad, l, s}, "gradients", false);
    }
    if (int target = fused[l].writes_output_of; reuse && target >= 0 && !fused[l].skipped)
      place_output(static_cast<size_t>(target));
    if (written(l)) place_output(l);
    if (!reuse) continue;
    // Saved tensors are scratch in inference; inputs whose last reader this was are done.
    free.insert(free.end(), scratch.begin(), scratch.end());
    auto done = [&](size_t producer) {
      size_t buffer = output_buffer[producer];
      if (buffer != unplaced && std::find(free.begin(), free.end(), buffer) == free.end()) free.push_back(buffer);
    };
    for (int producer : layer.inputs)
      if (producer >= 0 && last_use[static_cast<size_t>(producer)] == l) done(static_cast<size_t>(producer));
    if (last_use[l] == l) done(l);  // read by no one
  }
  if (with_gradients_) {
    // Layers' output gradients share buffers by their lifetimes in backward, as inference's
    // activations do in forward: one is written first by the backward of its last reader and
    // read last by the backward of the layer that computes it (its writer, where training fused
    // it in). One that nothing reads (a loss, seeded once for every step) keeps its own.
    auto place_grad = [&](size_t l, bool shared) {
      const Layer& layer = layers_[l];
      return place({layer.name + ".grad", layer.output_shape, layer.op->output_dtype(activations_),
                    GraphLayout::Kind::output_grad, l, 0},
                   "activation gradients", shared);
    };
    std::vector<size_t> reader(layers_.size());  // whose backward reads a layer's gradient last
    for (size_t l = 0; l < layers_.size(); ++l) reader[l] = l;
    for (size_t w = 0; w < layers_.size(); ++w)
      if (trained[w].writes_output_of >= 0) reader[static_cast<size_t>(trained[w].writes_output_of)] = w;
    std::vector<std::vector<size_t>> first_written(layers_.size()), last_read(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (!needs_grad_[l] || !written(l)) continue;
      if (last_use[l] <= l || last_use[l] >= layers_.size()) {
        place_grad(l, false);
        continue;
      }
      first_written[last_use[l]].push_back(l);
      last_read[reader[l]].push_back(l);
    }
    std::vector<size_t> grad_buffer(layers_.size());
    for (size_t t = layers_.size(); t-- > 0;) {
      for (size_t l : first_written[t]) grad_buffer[l] = place_grad(l, true);
      for (size_t l : last_read[t]) free.push_back(grad_buffer[l]);
    }
  }
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].gradient && with_gradients_)
      place({inputs_[i].name + ".grad", inputs_[i].shape, inputs_[i].dtype, GraphLayout::Kind::input_grad, 0, i},
            "activation gradients", false);
  if (reuse) place_stream_ring(layout, streaming_);
  return layout;
}

}  // namespace tessera
