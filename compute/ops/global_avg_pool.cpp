#include "compute/ops/global_avg_pool.h"

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct Push {
  uint32_t count, plane, accumulate;
};
}  // namespace

std::unique_ptr<Op> make_global_avg_pool(const LayerConfig&) { return std::make_unique<GlobalAvgPool>(); }

Shape GlobalAvgPool::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 4)
    throw ShapeError("global_avg_pool takes one NCHW input, got " +
                     (inputs.empty() ? std::string("none") : to_string(inputs[0])));
  planes_ = inputs[0][0] * inputs[0][1];
  plane_ = inputs[0][2] * inputs[0][3];
  return {inputs[0][0], inputs[0][1]};
}

// One invocation per plane: N*C planes keep a device busy, and the planes are small (7x7 in
// resnet18).
void GlobalAvgPool::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto kernel = kernel_for<Push>(kernels, vk::kernel::global_avg_pool_forward, *t.output, {kElementwiseGroup});
  recorder.dispatch_elements(kernel, {reads(*t.inputs[0]), writes(*t.output)},
                             Push{static_cast<uint32_t>(planes_), static_cast<uint32_t>(plane_), 0}, planes_,
                             kElementwiseGroup);
}

void GlobalAvgPool::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  auto kernel = kernel_for<Push>(kernels, vk::kernel::global_avg_pool_backward, *t.output_grad, {kElementwiseGroup});
  int64_t count = planes_ * plane_;
  recorder.dispatch_elements(kernel, {reads(*t.output_grad), input_grad_arg(t, 0)},
                             Push{static_cast<uint32_t>(count), static_cast<uint32_t>(plane_), accumulates(t, 0)},
                             count, kElementwiseGroup);
}

}  // namespace tessera
