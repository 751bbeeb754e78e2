#include "compute/ops/avg_pool2d.h"

#include "compute/ops/input_grad.h"

namespace tessera {

std::unique_ptr<Op> make_avg_pool2d(const LayerConfig& layer) { return std::make_unique<AvgPool2d>(layer); }

void AvgPool2d::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto pool_kernel = kernel(kernels, vk::kernel::avg_pool2d_forward, *t.output, false);
  int64_t count = element_count(output_);
  recorder.dispatch_elements(pool_kernel, {reads(*t.inputs[0]), writes(*t.output)},
                             Push{static_cast<uint32_t>(count), 0}, count, kElementwiseGroup);
}

// Scatters per window or gathers per input element, as max pooling does.
void AvgPool2d::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  auto pool_kernel = kernel(kernels, vk::kernel::avg_pool2d_backward, *t.output_grad, true);
  int64_t count = backward_count();
  recorder.dispatch_elements(pool_kernel, {reads(*t.output_grad), input_grad_arg(t, 0)},
                             Push{static_cast<uint32_t>(count), t.accumulate_input_grads[0] ? 1u : 0u}, count,
                             kElementwiseGroup);
}

}  // namespace tessera
