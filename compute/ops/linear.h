// Linear (dense) layer, PyTorch's nn.Linear: y[n,o] = sum_i x[n,i] weight[o,i] + bias[o].
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Linear : public Op {
 public:
  Linear(int64_t out_features, bool bias) : out_features_(out_features), has_bias_(bias) {}
  std::string type() const override { return "linear"; }
  // x [N, in] -> y [N, out]; x [N, T, in] -> y [N, T, out] (tokens: rows of the batch)
  Shape infer(const std::vector<Shape>& inputs) override;
  // weight [out, in], bias [out]: U(-1/sqrt(in), 1/sqrt(in)) as in PyTorch; weight^T [in, out],
  // prepared for inference (training allocates none: TensorSpec::read_in_training).
  std::vector<TensorSpec> tensors() const override;
  // y = x weight^T + bias (then max(y, 0) with a fused ReLU, OpTensors::relu); reads weight^T
  // once prepared.
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // weight^T from the weight (shaders/conv2d_forward_weight.comp with a block of one).
  void prepare(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx (+)= dy weight; dweight += dy^T x; dbias += sum_n dy
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  Fusions fusions() const override { return {.relu = true}; }
  double forward_flops() const override;

 private:
  const Tensor& transposed_weight(const OpTensors& t) const { return *t.tensors[has_bias_ ? 2 : 1]; }
  int64_t out_features_, in_features_ = 0, batch_ = 0;
  bool has_bias_;
};

std::unique_ptr<Op> make_linear(const LayerConfig& layer);

}  // namespace tessera
