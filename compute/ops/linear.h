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
  // weight [out, in], bias [out]: U(-1/sqrt(in), 1/sqrt(in)) as in PyTorch; inference only, a
  // scratch [in, out] for prepare() (training allocates none: TensorSpec::inference_only).
  std::vector<TensorSpec> tensors() const override;
  // y = x weight^T + bias, then the epilogue fused in (OpTensors::epilogue); once prepared,
  // the weight's buffer holds weight^T [in, out].
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // Transposes the weight in its own buffer, through the scratch (shaders/conv2d_forward_weight.comp
  // with a block of one, then a copy): an inference graph's weight is then weight^T
  // (Network::prepare runs it once).
  void prepare(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx (+)= dy weight; dweight += dy^T x; dbias += sum_n dy
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // Both passes take an x over what one binding reaches a window of rows at a time (a bag of
  // 100,000 patches of 1,536 features in fp16 is 307 MB; lavapipe binds 128 MiB).
  bool reads_in_windows(size_t input) const override { return input == 0; }
  // Features are rows of record_gemm's product: the scale is per output feature.
  EpilogueSteps fusions() const override {
    return {EpilogueStep::relu, EpilogueStep::gelu, EpilogueStep::silu, EpilogueStep::scale, EpilogueStep::residual};
  }
  double forward_flops() const override;

 private:
  int64_t out_features_, in_features_ = 0, batch_ = 0;
  bool has_bias_;
};

std::unique_ptr<Op> make_linear(const LayerConfig& layer);

}  // namespace tessera
