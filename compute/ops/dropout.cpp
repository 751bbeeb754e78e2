#include "compute/ops/dropout.h"

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct Push {
  uint32_t count, first_index, seed;
  float probability, scale;
  uint32_t accumulate;
};

// FNV-1a: a stable hash of the layer's name, so that two dropout layers draw different masks.
uint32_t hash_name(const std::string& name) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : name) hash = (hash ^ c) * 16777619u;
  return hash;
}
}  // namespace

std::unique_ptr<Op> make_dropout(const LayerConfig& layer) {
  double p = layer.number("p", 0.5);
  if (!(p >= 0 && p < 1)) layer.fail("p", "must be in [0, 1), got " + std::to_string(p));
  return std::make_unique<Dropout>(static_cast<float>(p), hash_name(layer.name()));
}

Shape Dropout::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].empty()) throw ShapeError("dropout takes one input with a batch dimension");
  count_ = element_count(inputs[0]);
  per_sample_ = inputs[0][0] ? count_ / inputs[0][0] : 0;
  return inputs[0];
}

void Dropout::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  record(recorder, kernels, t, *t.inputs[0], writes(*t.output), false);
}

void Dropout::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  record(recorder, kernels, t, *t.output_grad, input_grad_arg(t, 0), t.accumulate_input_grads[0]);
}

// Both passes multiply by the same mask; in evaluation p = 0 keeps every element unscaled.
void Dropout::record(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, const Tensor& source,
                     vk::BufferArg destination, bool accumulate) {
  float p = t.training ? probability_ : 0.0f;
  Push push{static_cast<uint32_t>(count_),
            static_cast<uint32_t>(int64_t{t.sample_offset} * per_sample_),
            t.seed ^ layer_hash_,
            p,
            1.0f / (1.0f - p),
            accumulate ? 1u : 0u};
  auto kernel = kernel_for<Push>(kernels, vk::kernel::dropout_apply, source, {kElementwiseGroup});
  recorder.dispatch_elements(kernel, {reads(*t.step), reads(source), destination}, push, count_,
                             kElementwiseGroup);
}

}  // namespace tessera
