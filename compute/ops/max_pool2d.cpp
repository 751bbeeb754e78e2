#include "compute/ops/max_pool2d.h"

#include "compute/ops/input_grad.h"

namespace tessera {

std::unique_ptr<Op> make_max_pool2d(const LayerConfig& layer) { return std::make_unique<MaxPool2d>(layer); }

std::vector<TensorSpec> MaxPool2d::tensors() const { return {{"argmax", output_, TensorRole::saved, DType::u32}}; }

void MaxPool2d::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto pool_kernel = kernel(kernels, vk::kernel::max_pool2d_forward, *t.output, false);
  int64_t count = element_count(output_);
  recorder.dispatch_elements(
      pool_kernel,
      {reads(*t.inputs[0]), writes(*t.output), writes(*t.tensors[0])},
      Push{static_cast<uint32_t>(count), 0}, count, kElementwiseGroup);
}

// Where windows tile the input each invocation writes its window's gradient; elsewhere one
// invocation per input element gathers from the windows that cover it, so overlapping
// windows need no atomics and the sum has a fixed order.
void MaxPool2d::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  auto pool_kernel = kernel(kernels, vk::kernel::max_pool2d_backward, *t.output_grad, true);
  int64_t count = backward_count();
  recorder.dispatch_elements(
      pool_kernel, {reads(*t.tensors[0]), reads(*t.output_grad), input_grad_arg(t, 0)},
      Push{static_cast<uint32_t>(count), t.accumulate_input_grads[0] ? 1u : 0u}, count, kElementwiseGroup);
}

}  // namespace tessera
