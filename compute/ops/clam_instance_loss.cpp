#include "compute/ops/clam_instance_loss.h"

#include <cmath>

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct Push {
  uint32_t rows, width, classes, k_sample, columns, subtyping, accumulate;
};
}  // namespace

std::unique_ptr<Op> make_clam_instance_loss(const LayerConfig& layer) {
  return std::make_unique<ClamInstanceLoss>(layer.integer("classes", std::nullopt, 2), layer.integer("k_sample", 8, 1, kMaxKSample),
                                            layer.boolean("subtyping", false));
}

Shape ClamInstanceLoss::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 4 || inputs[0].size() != 2 || inputs[1].size() != 2 || inputs[0][0] != inputs[1][0] ||
      (inputs[0][1] != 1 && inputs[0][1] != classes_) || inputs[1][1] < 1 || inputs[2] != Shape{1} ||
      inputs[3] != Shape{1})
    throw ShapeError("clam_instance_loss takes attention scores [M,1] or [M," + std::to_string(classes_) +
                     "], features [M,D], a count [1] and a label [1], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])) +
                     (inputs.size() > 1 ? " and " + to_string(inputs[1]) : std::string()));
  rows_ = inputs[1][0];
  width_ = inputs[1][1];
  columns_ = inputs[0][1];
  return {1};
}

std::vector<TensorSpec> ClamInstanceLoss::tensors() const {
  float bound = 1.0f / std::sqrt(static_cast<float>(width_));
  return {{"weight", {classes_, 2, width_}, TensorRole::parameter, DType::f32, {Init::uniform, bound}},
          {"bias", {classes_, 2}, TensorRole::parameter, DType::f32, {Init::uniform, bound}},
          {"selected", {slots()}, TensorRole::saved, DType::u32},
          {"row_grads", {slots(), 2}, TensorRole::saved},
          {"row_losses", {slots()}, TensorRole::saved}};
}

void ClamInstanceLoss::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  Push push{static_cast<uint32_t>(rows_),     static_cast<uint32_t>(width_),   static_cast<uint32_t>(classes_),
            static_cast<uint32_t>(k_sample_), static_cast<uint32_t>(columns_), subtyping_ ? 1u : 0u, 0};
  const Tensor &scores = *t.inputs[0], &h = *t.inputs[1], &count = *t.inputs[2], &labels = *t.inputs[3];
  const Tensor &weight = *t.tensors[0], &bias = *t.tensors[1], &selected = *t.tensors[2];
  const Tensor &row_grads = *t.tensors[3], &row_losses = *t.tensors[4];
  // A workgroup per class and side scans the bag k times (k x M compares: 80,000 for 10,001
  // patches), simpler than a sort and as cheap at k = 8.
  recorder.dispatch(kernel_for<Push>(kernels, vk::kernel::clam_instance_loss_select, scores),
                    {reads(scores), reads(count), reads(labels), writes(selected)}, push,
                    static_cast<uint32_t>(classes_ * 2));
  recorder.dispatch_elements(
      kernel_for<Push>(kernels, vk::kernel::clam_instance_loss_rows, h, {kElementwiseGroup}),
      {reads(h), reads(weight), reads(bias), reads(selected), reads(count), reads(labels), writes(row_grads),
       writes(row_losses)},
      push, slots(), kElementwiseGroup);
  // The sum in slot order, in one invocation: the same bag gives the same loss to the bit.
  recorder.dispatch(kernels.get<Push>(vk::kernel::clam_instance_loss_sum), {reads(row_losses), reads(labels),
                    writes(*t.output)}, push, 1);
}

void ClamInstanceLoss::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  Push push{static_cast<uint32_t>(rows_),     static_cast<uint32_t>(width_),   static_cast<uint32_t>(classes_),
            static_cast<uint32_t>(k_sample_), static_cast<uint32_t>(columns_), subtyping_ ? 1u : 0u, 0};
  const Tensor &h = *t.inputs[1], &dl = *t.output_grad;
  const Tensor &weight = *t.tensors[0], &selected = *t.tensors[2], &row_grads = *t.tensors[3];
  // C*2*D weight elements, then C*2 biases, in one dispatch.
  recorder.dispatch_elements(
      kernel_for<Push>(kernels, vk::kernel::clam_instance_loss_backward_params, h, {kElementwiseGroup}),
      {reads(h), reads(selected), reads(row_grads), reads(dl), updates(*t.grads[0]), updates(*t.grads[1])}, push,
      classes_ * 2 * (width_ + 1), kElementwiseGroup);
  if (t.input_grads[1]) {
    // Only the chosen rows get a gradient here: the others are zeroed first unless another
    // consumer of h has written its share, then the first slot of each chosen row adds the sum
    // over every slot of that row (no two invocations write one element).
    if (!t.accumulate_input_grads[1]) recorder.fill(t.input_grads[1]->buffer(), 0);
    recorder.dispatch_elements(
        kernel_for<Push>(kernels, vk::kernel::clam_instance_loss_backward_features, *t.input_grads[1],
                         {kElementwiseGroup}),
        {reads(weight), reads(selected), reads(row_grads), reads(dl), updates(*t.input_grads[1])}, push,
        slots() * width_, kElementwiseGroup);
  }
  // No gradient through the choice of rows: where this op is the first to write the scores'
  // gradient, it writes zeros for the others to add to.
  if (t.input_grads[0] && !t.accumulate_input_grads[0]) recorder.fill(t.input_grads[0]->buffer(), 0);
}

}  // namespace tessera
