#include "compute/ops/relu.h"

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct ForwardPush {
  uint32_t count;
};
struct BackwardPush {
  uint32_t count, accumulate;
};
}  // namespace

std::unique_ptr<Op> make_relu(const LayerConfig&) { return std::make_unique<Relu>(); }

Shape Relu::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1) throw ShapeError("relu takes one input");
  count_ = element_count(inputs[0]);
  return inputs[0];
}

void Relu::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto kernel = kernel_for<ForwardPush>(kernels, vk::kernel::relu_forward, *t.output, {kElementwiseGroup});
  recorder.dispatch_elements(kernel, {reads(*t.inputs[0]), writes(*t.output)},
                             ForwardPush{static_cast<uint32_t>(count_)}, (count_ + 3) / 4, kElementwiseGroup);
}

void Relu::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  record_relu_backward(recorder, kernels, t, 0, count_);
}

void record_relu_backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, size_t input,
                          int64_t count) {
  if (!t.input_grads[input]) return;
  recorder.dispatch_elements(kernel_for<BackwardPush>(kernels, vk::kernel::relu_backward, *t.output_grad, {kElementwiseGroup}),
                             {reads(*t.output), reads(*t.output_grad), input_grad_arg(t, input)},
                             BackwardPush{static_cast<uint32_t>(count), accumulates(t, input)}, (count + 3) / 4,
                             kElementwiseGroup);
}

void record_relu_backward_in_place(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& output,
                                   const Tensor& output_grad) {
  int64_t count = output.count();
  recorder.dispatch_elements(kernel_for<ForwardPush>(kernels, vk::kernel::relu_backward_in_place, output_grad, {kElementwiseGroup}),
                             {reads(output), updates(output_grad)},
                             ForwardPush{static_cast<uint32_t>(count)}, (count + 3) / 4, kElementwiseGroup);
}

}  // namespace tessera
