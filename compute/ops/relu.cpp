#include "compute/ops/relu.h"

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
  auto& kernel = kernels.get("relu_forward", {kElementwiseGroup});
  recorder.dispatch_elements(kernel, {vk::reads(t.inputs[0]->buffer()), vk::writes(t.output->buffer())},
                             ForwardPush{static_cast<uint32_t>(count_)}, (count_ + 3) / 4, kElementwiseGroup);
}

void Relu::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  auto& kernel = kernels.get("relu_backward", {kElementwiseGroup});
  auto& dx = t.input_grads[0]->buffer();
  recorder.dispatch_elements(
      kernel,
      {vk::reads(t.output->buffer()), vk::reads(t.output_grad->buffer()),
       t.accumulate_input_grads[0] ? vk::updates(dx) : vk::writes(dx)},
      BackwardPush{static_cast<uint32_t>(count_), t.accumulate_input_grads[0] ? 1u : 0u}, (count_ + 3) / 4,
      kElementwiseGroup);
}

void record_relu_backward_in_place(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& output,
                                   const Tensor& output_grad) {
  int64_t count = output.count();
  recorder.dispatch_elements(kernels.get("relu_backward_in_place", {kElementwiseGroup}),
                             {vk::reads(output.buffer()), vk::updates(output_grad.buffer())},
                             ForwardPush{static_cast<uint32_t>(count)}, (count + 3) / 4, kElementwiseGroup);
}

}  // namespace tessera
