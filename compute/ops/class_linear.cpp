#include "compute/ops/class_linear.h"

#include <cmath>

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct Push {
  uint32_t batch, classes, width, accumulate;
};
}  // namespace

std::unique_ptr<Op> make_class_linear(const LayerConfig& layer) {
  return std::make_unique<ClassLinear>(layer.integer("out_features", std::nullopt, 1));
}

Shape ClassLinear::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 2 || inputs[0][1] % classes_ != 0 || inputs[0][1] < classes_)
    throw ShapeError("class_linear takes x [N, C*D] with C = out_features = " + std::to_string(classes_) + ", got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])));
  batch_ = inputs[0][0];
  width_ = inputs[0][1] / classes_;
  return {batch_, classes_};
}

std::vector<TensorSpec> ClassLinear::tensors() const {
  float bound = 1.0f / std::sqrt(static_cast<float>(width_));
  return {{"weight", {classes_, width_}, TensorRole::parameter, DType::f32, {Init::uniform, bound}},
          {"bias", {classes_}, TensorRole::parameter, DType::f32, {Init::uniform, bound}}};
}

void ClassLinear::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  Push push{static_cast<uint32_t>(batch_), static_cast<uint32_t>(classes_), static_cast<uint32_t>(width_), 0};
  recorder.dispatch_elements(
      kernel_for<Push>(kernels, vk::kernel::class_linear_forward, *t.output, {kElementwiseGroup}),
      {reads(*t.inputs[0]), reads(*t.tensors[0]), reads(*t.tensors[1]), writes(*t.output)}, push, batch_ * classes_,
      kElementwiseGroup);
}

void ClassLinear::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Tensor& dy = *t.output_grad;
  Push push{static_cast<uint32_t>(batch_), static_cast<uint32_t>(classes_), static_cast<uint32_t>(width_), 0};
  // The weight's and the bias's gradients in one dispatch: C*D weight elements, then C biases.
  recorder.dispatch_elements(
      kernel_for<Push>(kernels, vk::kernel::class_linear_backward_params, dy, {kElementwiseGroup}),
      {reads(dy), reads(*t.inputs[0]), updates(*t.grads[0]), updates(*t.grads[1])}, push,
      classes_ * (width_ + 1), kElementwiseGroup);
  if (!t.input_grads[0]) return;
  push.accumulate = accumulates(t, 0);
  recorder.dispatch_elements(
      kernel_for<Push>(kernels, vk::kernel::class_linear_backward_input, dy, {kElementwiseGroup}),
      {reads(dy), reads(*t.tensors[0]), input_grad_arg(t, 0)}, push, batch_ * classes_ * width_, kElementwiseGroup);
}

}  // namespace tessera
