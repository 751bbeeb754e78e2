#include "compute/ops/layer_scale.h"

namespace tessera {

namespace {
struct Push {
  uint32_t count, width;
};
}  // namespace

std::unique_ptr<Op> make_layer_scale(const LayerConfig& layer) {
  return std::make_unique<LayerScale>(static_cast<float>(layer.number("init", 1e-5)));
}

Shape LayerScale::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].empty() || inputs[0].back() < 1)
    throw ShapeError("layer_scale takes one input [..., features]");
  width_ = inputs[0].back();
  count_ = element_count(inputs[0]);
  return inputs[0];
}

std::vector<TensorSpec> LayerScale::tensors() const {
  return {{"gamma", {width_}, TensorRole::parameter, DType::f32, {Init::constant, init_}}};
}

void LayerScale::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  recorder.dispatch_elements(kernel_for<Push>(kernels, vk::kernel::layer_scale_forward, *t.output, {kElementwiseGroup}),
                             {reads(*t.inputs[0]), reads(*t.tensors[0]), writes(*t.output)},
                             Push{static_cast<uint32_t>(count_), static_cast<uint32_t>(width_)}, count_,
                             kElementwiseGroup);
}

}  // namespace tessera
