#include "compute/ops/avg_pool2d.h"

#include "compute/ops/input_grad.h"

namespace tessera {

std::unique_ptr<Op> make_avg_pool2d(const LayerConfig& layer) { return std::make_unique<AvgPool2d>(layer); }

void AvgPool2d::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto& kernel = kernels.get("avg_pool2d_forward", {kElementwiseGroup});
  int64_t count = element_count(output_);
  recorder.dispatch_elements(kernel, {vk::reads(t.inputs[0]->buffer()), vk::writes(t.output->buffer())},
                             push(count, false), count, kElementwiseGroup);
}

// Gathers per input element, as max pooling does: no atomics where windows overlap.
void AvgPool2d::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  auto& kernel = kernels.get("avg_pool2d_backward", {kElementwiseGroup});
  int64_t count = element_count(input_);
  recorder.dispatch_elements(kernel, {vk::reads(t.output_grad->buffer()), input_grad_arg(t, 0)},
                             push(count, t.accumulate_input_grads[0]), count, kElementwiseGroup);
}

}  // namespace tessera
