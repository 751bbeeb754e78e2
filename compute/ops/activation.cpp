#include "compute/ops/activation.h"

namespace tessera {

namespace {
struct CountPush {
  uint32_t count;
};
struct SwiGluPush {
  uint32_t count, hidden;
};
}  // namespace

std::unique_ptr<Op> make_gelu(const LayerConfig&) { return std::make_unique<Activation>(Activation::Function::gelu); }
std::unique_ptr<Op> make_silu(const LayerConfig&) { return std::make_unique<Activation>(Activation::Function::silu); }
std::unique_ptr<Op> make_swiglu(const LayerConfig&) { return std::make_unique<SwiGlu>(); }

Shape Activation::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1) throw ShapeError(type() + " takes one input");
  count_ = element_count(inputs[0]);
  return inputs[0];
}

void Activation::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto kernel =
      kernel_for<CountPush>(kernels, vk::kernel::activation_forward, *t.output, {kElementwiseGroup, function_ == Function::gelu ? 0 : 1});
  recorder.dispatch_elements(kernel, {reads(*t.inputs[0]), writes(*t.output)}, CountPush{static_cast<uint32_t>(count_)},
                             (count_ + 3) / 4, kElementwiseGroup);
}

Shape SwiGlu::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].empty() || inputs[0].back() % 2 != 0)
    throw ShapeError("swiglu takes one input [..., 2H] (fc1's two halves), got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])));
  Shape output = inputs[0];
  output.back() /= 2;
  hidden_ = output.back();
  count_ = element_count(output);
  return output;
}

void SwiGlu::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  recorder.dispatch_elements(
      kernel_for<SwiGluPush>(kernels, vk::kernel::swiglu_forward, *t.output, {kElementwiseGroup}), {reads(*t.inputs[0]), writes(*t.output)},
      SwiGluPush{static_cast<uint32_t>(count_), static_cast<uint32_t>(hidden_)}, count_, kElementwiseGroup);
}

}  // namespace tessera
