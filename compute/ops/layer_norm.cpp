#include "compute/ops/layer_norm.h"

#include "compute/vk/context.h"

namespace tessera {

namespace {
struct Push {
  uint32_t rows, width;
  float eps;
};
}  // namespace

std::unique_ptr<Op> make_layer_norm(const LayerConfig& layer) {
  double eps = layer.number("eps", 1e-5);
  if (!(eps > 0)) layer.fail("eps", "must be above 0");
  return std::make_unique<LayerNorm>(static_cast<float>(eps));
}

uint32_t row_group(const vk::TileTarget& target, int64_t width) {
  if (target.device_type == "cpu") return target.subgroup_size;
  uint32_t group = 128;
  while (group > 32 && group / 2 >= width) group /= 2;
  return group;
}

Shape LayerNorm::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].empty() || inputs[0].back() < 1)
    throw ShapeError("layer_norm takes one input [..., features]");
  width_ = inputs[0].back();
  rows_ = element_count(inputs[0]) / width_;
  return inputs[0];
}

std::vector<TensorSpec> LayerNorm::tensors() const {
  return {{"weight", {width_}, TensorRole::parameter, DType::f32, {Init::ones}},
          {"bias", {width_}, TensorRole::parameter, DType::f32, {Init::zeros}}};
}

void record_layer_norm(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, const Tensor& y, int64_t rows, int64_t width, float eps) {
  const vk::TileTarget& target = kernels.tile_target();
  uint32_t group = row_group(target, width);
  bool subgroup_sum = group == target.subgroup_size && group == kernels.context().info().subgroup_size;
  auto kernel = kernel_for<Push>(kernels, vk::kernel::layer_norm_forward, y,
                                 {static_cast<int32_t>(group), subgroup_sum ? 1 : 0});
  // One workgroup per row: `group` elements per row, spread over x and y.
  recorder.dispatch_elements(kernel, {reads(x), reads(weight), reads(bias), writes(y)},
                             Push{static_cast<uint32_t>(rows), static_cast<uint32_t>(width), eps},
                             static_cast<uint64_t>(rows) * group, group);
}

void LayerNorm::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  record_layer_norm(recorder, kernels, *t.inputs[0], *t.tensors[0], *t.tensors[1], *t.output, rows_, width_, eps_);
}

}  // namespace tessera
