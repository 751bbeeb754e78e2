#include "compute/ops/add.h"

#include "compute/ops/input_grad.h"
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

std::unique_ptr<Op> make_add(const LayerConfig&) { return std::make_unique<Add>(); }

Shape Add::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 2) throw ShapeError("add takes two inputs");
  if (inputs[0] != inputs[1])
    throw ShapeError("add: the inputs differ in shape, " + to_string(inputs[0]) + " and " + to_string(inputs[1]));
  count_ = element_count(inputs[0]);
  return inputs[0];
}

void Add::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto kernel = kernel_for<ForwardPush>(kernels, vk::kernel::add_forward, *t.output, {kElementwiseGroup, t.epilogue.relu() ? 1 : 0});
  recorder.dispatch_elements(kernel,
                             {reads(*t.inputs[0]), reads(*t.inputs[1]),
                              writes(*t.output)},
                             ForwardPush{static_cast<uint32_t>(count_)}, count_, kElementwiseGroup);
}

void Add::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  for (size_t input = 0; input < 2; ++input)
    if (t.epilogue.relu())
      record_relu_backward(recorder, kernels, t, input, count_);
    else
      record_pass_through_grad(recorder, kernels, t, input, count_);
}

void record_pass_through_grad(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, size_t input,
                              int64_t count) {
  if (!t.input_grads[input]) return;
  auto kernel = kernel_for<BackwardPush>(kernels, vk::kernel::add_backward, *t.output_grad, {kElementwiseGroup});
  recorder.dispatch_elements(kernel, {reads(*t.output_grad), input_grad_arg(t, input)},
                             BackwardPush{static_cast<uint32_t>(count), accumulates(t, input)}, count,
                             kElementwiseGroup);
}

}  // namespace tessera
