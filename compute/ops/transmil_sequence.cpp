#include "compute/ops/transmil_sequence.h"

#include <cmath>

#include "compute/ops/gemm.h"
#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct Push {
  uint32_t rows, width, sequence_rows, accumulate;
};
}  // namespace

int64_t transmil_grid_side(int64_t instances) {
  auto side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(instances))));
  // The square root rounds: corrected with whole numbers, as the shaders do.
  while (side * side < instances) ++side;
  while (side > 0 && (side - 1) * (side - 1) >= instances) --side;
  return side;
}

std::unique_ptr<Op> make_transmil_sequence(const LayerConfig&) { return std::make_unique<TransmilSequence>(); }

Shape TransmilSequence::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 2 || inputs[0].size() != 2 || inputs[0][0] < 1 || inputs[1] != Shape{1})
    throw ShapeError("transmil_sequence takes features [M,D] and a count [1], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])));
  rows_ = inputs[0][0];
  width_ = inputs[0][1];
  const int64_t side = transmil_grid_side(rows_);
  sequence_rows_ = 1 + side * side;
  return {1, sequence_rows_, width_};
}

std::vector<TensorSpec> TransmilSequence::tensors() const {
  TensorSpec token{"cls_token", {1, 1, width_}, TensorRole::parameter, DType::f32, {Init::normal, 1.0f}};
  token.model_level = true;
  return {token};
}

void TransmilSequence::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const int64_t elements = sequence_rows_ * width_;
  recorder.dispatch_elements(
      kernel_for<Push>(kernels, vk::kernel::transmil_sequence_forward, *t.output, {kElementwiseGroup}),
      {reads(*t.inputs[0]), reads(*t.inputs[1]), reads(*t.tensors[0]), writes(*t.output)},
      Push{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), static_cast<uint32_t>(sequence_rows_), 0},
      static_cast<uint64_t>(elements), kElementwiseGroup);
}

void TransmilSequence::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Tensor& dy = *t.output_grad;
  if (t.input_grads[0])
    recorder.dispatch_elements(
        kernel_for<Push>(kernels, vk::kernel::transmil_sequence_backward, dy, {kElementwiseGroup}),
        {reads(dy), reads(*t.inputs[1]), input_grad_arg(t, 0)},
        Push{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), static_cast<uint32_t>(sequence_rows_),
             accumulates(t, 0)},
        static_cast<uint64_t>(rows_ * width_), kElementwiseGroup);
  // The class token's gradient is dy's first row: a bias gradient over a batch of one row.
  record_bias_backward(recorder, kernels, dy, *t.grads[0], 1, static_cast<uint32_t>(width_), 1);
}

}  // namespace tessera
