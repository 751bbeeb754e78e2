#include "compute/ops/linear.h"

#include <algorithm>
#include <cmath>

#include "compute/ops/gemm.h"
#include "compute/ops/relu.h"
#include "compute/ops/row_windows.h"

namespace tessera {

namespace {

// The window's rows of a matrix of `width` columns (the whole tensor where one window holds them all).
MatrixView rows_of(const Tensor* tensor, uint32_t row_stride, uint32_t col_stride, const RowWindow& window,
                   int64_t batch, int64_t width) {
  if (window.first == 0 && window.rows == batch) return {tensor, row_stride, col_stride};
  return {tensor, row_stride, col_stride, uint64_t{window.first} * static_cast<uint64_t>(width),
          uint64_t{window.rows} * static_cast<uint64_t>(width)};
}

// The whole batch at once where x [N, in] fits one binding; else windows of rows, their starts
// aligned in x and y [N, out] alike.
std::vector<RowWindow> windows(const vk::Kernels& kernels, const OpTensors& t, int64_t batch, int64_t in, int64_t out) {
  return row_windows(kernels.tile_target(), *t.inputs[0], batch,
                     {in * static_cast<int64_t>(element_size(t.inputs[0]->dtype())),
                      out * static_cast<int64_t>(element_size(t.output->dtype()))});
}

}  // namespace

std::unique_ptr<Op> make_linear(const LayerConfig& layer) {
  return std::make_unique<Linear>(layer.integer("out_features", std::nullopt, 1), layer.boolean("bias", true));
}

Shape Linear::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1) throw ShapeError("linear takes one input");
  // As nn.Linear, over the last dimension: [batch, features], or a ViT's [batch, tokens, features].
  // A feature map [N,C,H,W] is refused: a forgotten flatten would otherwise run over its width.
  if (inputs[0].size() != 2 && inputs[0].size() != 3)
    throw ShapeError("linear takes [batch, features] or [batch, tokens, features], got " + to_string(inputs[0]) +
                     " (flatten first)");
  in_features_ = inputs[0].back();
  if (in_features_ > kMaxGemmDimension)
    throw ShapeError("linear: " + std::to_string(in_features_) + " input features (at most " +
                     std::to_string(kMaxGemmDimension) + ")");
  batch_ = element_count(inputs[0]) / std::max<int64_t>(in_features_, 1);
  Shape output = inputs[0];
  output.back() = out_features_;
  return output;
}

std::vector<TensorSpec> Linear::tensors() const {
  float bound = 1.0f / std::sqrt(static_cast<float>(in_features_));
  std::vector<TensorSpec> specs{{"weight", {out_features_, in_features_}, TensorRole::parameter, DType::f32,
                                 {Init::uniform, bound}}};
  specs[0].follows_weight_dtype = true;  // read only by record_gemm, which takes fp16 operands
  if (has_bias_) specs.push_back({"bias", {out_features_}, TensorRole::parameter, DType::f32, {Init::uniform, bound}});
  // Scratch of prepare(), shared with the activations (saved: an inference graph frees it after
  // the layer, and prepare() runs before any pass), so that inference holds one copy of the
  // weight: ViT-L's 1.2 GB twice would not fit lavapipe's 2 GiB.
  TensorSpec scratch{"weight_transposed", {in_features_, out_features_}, TensorRole::saved};
  scratch.inference_only = true;
  scratch.follows_weight_dtype = true;  // copied back over the weight, so of its type
  specs.push_back(scratch);
  return specs;
}

double Linear::forward_flops() const { return 2.0 * static_cast<double>(batch_ * out_features_ * in_features_); }

void Linear::prepare(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Tensor& weight = *t.tensors[0];
  const Tensor& scratch = *t.tensors[has_bias_ ? 2 : 1];
  record_blocked_weight(recorder, kernels, weight, scratch, static_cast<uint32_t>(out_features_),
                        static_cast<uint32_t>(in_features_), 1);
  recorder.copy(scratch.buffer(), 0, weight.buffer(), 0, weight.bytes());
}

void Linear::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto batch = static_cast<uint32_t>(batch_), in = static_cast<uint32_t>(in_features_),
       out = static_cast<uint32_t>(out_features_);
  // y^T [out, N] = weight [out, in] x^T [in, N]: rows are output features. The invocations of a
  // workgroup take neighbouring rows, so the weight read as stored puts their loads `in` floats
  // apart, each in its own cache line; W^T puts them side by side (with gemm.comp's columns-first
  // order, ViT-L's linear layers 1.4-1.8x faster on lavapipe: bench/README.md). Training reads the
  // weight as stored: its transpose would cost a pass over the weight every step.
  MatrixView weight = t.prepared ? MatrixView{t.tensors[0], 1, out} : MatrixView{t.tensors[0], in, 1};
  for (RowWindow window : windows(kernels, t, batch, in, out))
    record_gemm(recorder, kernels, out, window.rows, in, weight, rows_of(t.inputs[0], 1, in, window, batch, in),
                rows_of(t.output, 1, out, window, batch, out), false, has_bias_ ? t.tensors[1] : nullptr, t.epilogue);
}

void Linear::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto batch = static_cast<uint32_t>(batch_), in = static_cast<uint32_t>(in_features_),
       out = static_cast<uint32_t>(out_features_);
  const Tensor& dy = *t.output_grad;
  if (t.epilogue.relu()) record_relu_backward_in_place(recorder, kernels, *t.output, *t.output_grad);
  for (RowWindow window : windows(kernels, t, batch, in, out)) {
    if (t.input_grads[0]) {
      // dx^T [in, N] = weight^T [in, out] dy^T [out, N]
      record_gemm(recorder, kernels, in, window.rows, out, {t.tensors[0], 1, in},
                  rows_of(&dy, 1, out, window, batch, out), rows_of(t.input_grads[0], 1, in, window, batch, in),
                  t.accumulate_input_grads[0]);
    }
    // dweight [out, in] += dy^T [out, N] x [N, in]
    record_gemm(recorder, kernels, out, in, window.rows, rows_of(&dy, 1, out, window, batch, out),
                rows_of(t.inputs[0], in, 1, window, batch, in), {t.grads[0], in, 1}, true);
  }
  if (has_bias_) record_bias_backward(recorder, kernels, dy, *t.grads[1], batch, out, 1);
}

}  // namespace tessera
