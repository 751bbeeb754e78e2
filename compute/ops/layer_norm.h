// Layer normalisation, PyTorch's nn.LayerNorm over the last dimension with an affine weight and
// bias (a ViT's norm1, norm2 and final norm; TransMIL's layer norms, which train).
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class LayerNorm : public Op {
 public:
  explicit LayerNorm(float eps) : eps_(eps) {}
  std::string type() const override { return "layer_norm"; }
  // x [..., D] -> y [..., D]
  Shape infer(const std::vector<Shape>& inputs) override;
  // weight [D] (ones), bias [D] (zeros), as PyTorch; statistics [rows, 2] (each row's mean and
  // inverse std: written by a training forward for backward, TensorSpec::training_only, so an
  // inference graph allocates none)
  std::vector<TensorSpec> tensors() const override;
  // y = (x - mean) / sqrt(var + eps) * weight + bias per row (biased variance), one workgroup a row
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx from the saved statistics, one workgroup a row; dweight and dbias summed over the rows
  // by workgroups of 16 columns that share the rows (bag_rows.glsl)
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  float eps_;
  int64_t rows_ = 0, width_ = 0;
};

std::unique_ptr<Op> make_layer_norm(const LayerConfig& layer);

// The workgroup of a kernel that gives one workgroup to one row of `width` (layer_norm): on CPU
// devices one subgroup, which sums without barriers; on GPUs 128 invocations, or fewer for a
// short row.
uint32_t row_group(const vk::TileTarget& target, int64_t width);
// A row kernel's specialization constants (layer_norm's, nystrom_attention's softmax): its
// workgroup (row_group), and whether that is one subgroup, which reduces without barriers.
std::vector<int32_t> row_constants(vk::Kernels& kernels, int64_t width);

// y = layer_norm(x) over rows of `width` (x [rows, width], weight and bias [width]), one workgroup a
// row: LayerNorm's forward, for ops that normalise inside themselves (attentional_pool's ln_q, ln_k).
// With `statistics` ([rows, 2], a training forward's) each row's mean and inverse std are kept too.
void record_layer_norm(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, const Tensor& y, int64_t rows, int64_t width, float eps,
                       const Tensor* statistics = nullptr);

}  // namespace tessera
