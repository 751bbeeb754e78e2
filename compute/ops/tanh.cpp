#include "compute/ops/tanh.h"

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct Push {
  uint32_t count, accumulate;
};
}  // namespace

std::unique_ptr<Op> make_tanh(const LayerConfig&) { return std::make_unique<Tanh>(); }

Shape Tanh::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1) throw ShapeError("tanh takes one input");
  count_ = element_count(inputs[0]);
  return inputs[0];
}

void Tanh::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  recorder.dispatch_elements(kernel_for<Push>(kernels, vk::kernel::tanh_forward, *t.output, {kElementwiseGroup}),
                             {reads(*t.inputs[0]), writes(*t.output)}, Push{static_cast<uint32_t>(count_), 0}, count_,
                             kElementwiseGroup);
}

void Tanh::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  recorder.dispatch_elements(kernel_for<Push>(kernels, vk::kernel::tanh_backward, *t.output_grad, {kElementwiseGroup}),
                             {reads(*t.output), reads(*t.output_grad), input_grad_arg(t, 0)},
                             Push{static_cast<uint32_t>(count_), accumulates(t, 0)}, count_, kElementwiseGroup);
}

}  // namespace tessera
