#include "compute/ops/layer_norm.h"

#include "compute/ops/bag_rows.h"
#include "compute/ops/input_grad.h"
#include "compute/vk/context.h"

namespace tessera {

namespace {
enum Slot : size_t { weight, bias, statistics };

struct Push {
  uint32_t rows, width;
  float eps;
};
struct InputGradPush {
  uint32_t rows, width, accumulate;
};
struct ParametersPush {
  uint32_t rows, width;
};

}  // namespace

std::unique_ptr<Op> make_layer_norm(const LayerConfig& layer) {
  double eps = layer.number("eps", 1e-5);
  if (!(eps > 0)) layer.fail("eps", "must be above 0");
  return std::make_unique<LayerNorm>(static_cast<float>(eps));
}

std::vector<int32_t> row_constants(vk::Kernels& kernels, int64_t width) {
  const vk::TileTarget& target = kernels.tile_target();
  uint32_t group = row_group(target, width);
  bool subgroup_sum = group == target.subgroup_size && group == kernels.context().info().subgroup_size;
  return {static_cast<int32_t>(group), subgroup_sum ? 1 : 0};
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
  TensorSpec saved{"statistics", {rows_, 2}, TensorRole::saved};
  saved.training_only = true;
  return {{"weight", {width_}, TensorRole::parameter, DType::f32, {Init::ones}},
          {"bias", {width_}, TensorRole::parameter, DType::f32, {Init::zeros}},
          saved};
}

void record_layer_norm(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, const Tensor& y, int64_t rows, int64_t width, float eps,
                       const Tensor* statistics) {
  std::vector<int32_t> constants = row_constants(kernels, width);
  auto group = static_cast<uint32_t>(constants[0]);
  Push push{static_cast<uint32_t>(rows), static_cast<uint32_t>(width), eps};
  // One workgroup per row: `group` elements per row, spread over x and y.
  const uint64_t elements = static_cast<uint64_t>(rows) * group;
  if (!statistics) {
    recorder.dispatch_elements(kernel_for<Push>(kernels, vk::kernel::layer_norm_forward, y, constants),
                               {reads(x), reads(weight), reads(bias), writes(y)}, push, elements, group);
    return;
  }
  // The same kernel, which also keeps each row's statistics for backward.
  recorder.dispatch_elements(kernel_for<Push>(kernels, vk::kernel::layer_norm_forward_training, y, constants),
                             {reads(x), reads(weight), reads(bias), writes(y), writes(*statistics)}, push, elements,
                             group);
}

void LayerNorm::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (t.training && !t.tensors[statistics])
    throw std::logic_error("layer_norm: training forward without its saved statistics");
  record_layer_norm(recorder, kernels, *t.inputs[0], *t.tensors[weight], *t.tensors[bias], *t.output, rows_, width_, eps_,
                    t.training ? t.tensors[statistics] : nullptr);
}

void LayerNorm::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Tensor &x = *t.inputs[0], &dy = *t.output_grad, &saved = *t.tensors[statistics];
  const auto rows = static_cast<uint32_t>(rows_), width = static_cast<uint32_t>(width_);
  if (t.input_grads[0]) {
    std::vector<int32_t> constants = row_constants(kernels, width_);
    auto group = static_cast<uint32_t>(constants[0]);
    auto kernel = kernel_for<InputGradPush>(kernels, vk::kernel::layer_norm_backward_input, dy, constants);
    recorder.dispatch_elements(kernel,
                               {reads(x), reads(*t.tensors[weight]), reads(saved), reads(dy), input_grad_arg(t, 0)},
                               InputGradPush{rows, width, accumulates(t, 0)}, static_cast<uint64_t>(rows_) * group,
                               group);
  }
  // One pass over dy for both parameters (record_bias_backward would read dy again, a column a
  // workgroup, which strides through it).
  auto parameters = kernel_for<ParametersPush>(kernels, vk::kernel::layer_norm_backward_parameters, dy);
  recorder.dispatch(parameters,
                    {reads(x), reads(saved), reads(dy), updates(*t.grads[weight]), updates(*t.grads[bias])},
                    ParametersPush{rows, width}, bag_column_groups(width_));
}

}  // namespace tessera
