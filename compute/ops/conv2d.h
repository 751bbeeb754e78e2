// 2-D convolution, PyTorch's nn.Conv2d (groups = 1): x [N,C,H,W], weight [O,C,KH,KW],
// optional bias [O], any kernel size, stride and zero padding. Every pass is an implicit GEMM
// (shaders/gemm_block.glsl on CPU devices, gemm_tiled.glsl on GPUs) that reads x in place: no unfolded copy of the input.
#pragma once
#include <initializer_list>

#include "compute/ops/gemm.h"
#include "compute/ops/registry.h"

namespace tessera {

struct Conv2dShape {
  int64_t batch = 0, in_channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, out_height = 0, out_width = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride = 1, padding = 0;
};

class Conv2d : public Op {
 public:
  Conv2d(int64_t out_channels, int64_t kernel_h, int64_t kernel_w, int64_t stride, int64_t padding, bool bias);
  std::string type() const override { return "conv2d"; }
  // x [N,C,H,W] -> y [N,O,OH,OW], OH = (H + 2p - KH) / s + 1
  Shape infer(const std::vector<Shape>& inputs) override;
  // weight, bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as in PyTorch; the weight blocked for
  // the forward kernel (shaders/conv2d_forward_weight.comp), prepared; where the weight
  // gradient's reduction can be split, backward scratch for the partial sums of the slices.
  std::vector<TensorSpec> tensors() const override;
  // y[n,o,oh,ow] = bias[o] + sum_{c,kh,kw} weight[o,c,kh,kw] x[n,c,oh*s-p+kh,ow*s-p+kw],
  // then the epilogue fused in (OpTensors::epilogue: a folded batch norm, an activation, a
  // residual)
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // The blocked weight, scaled by a folded batch norm's gamma / sqrt(var + eps)
  void prepare(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx (+)= the transposed convolution of dy; dweight += dy (*) x; dbias += sum dy
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  double forward_flops() const override;
  // No scale: a layer_scale scales the last dimension (the width), not the channels.
  EpilogueSteps fusions() const override {
    return {EpilogueStep::batch_norm, EpilogueStep::relu, EpilogueStep::gelu, EpilogueStep::silu, EpilogueStep::residual};
  }

 private:
  struct Push {
    uint32_t batch, C, H, W, O, OH, OW, pad, k_per_slice, accumulate, has_bias;
    float eps;
    uint32_t phase_row = 0, phase_col = 0;
    uint32_t kernel_h, kernel_w;
  };
  Push push(bool accumulate, float eps = 0, int64_t slice_length = 0) const;
  // The weight gradient's reduction (N*OH*OW) in slices on this device.
  ReductionSlices weight_grad_slicing(const vk::TileTarget& target, const GemmTiles& tiles) const;
  // The specialization constants of the register-blocked conv2d shaders: these tiles and the
  // stride (the kernel's size is pushed); forward's also its weight's block and its epilogue.
  std::vector<int32_t> constants(const GemmTiles& tiles) const;
  std::vector<int32_t> forward_constants(const GemmTiles& tiles, const Epilogue& epilogue) const;
  // Those of the shared-memory tiled shaders (conv2d_tiled.glsl): the tiles', kernel size and
  // stride, then the kernel's own.
  std::vector<int32_t> tiled_constants(const GemmTiles& tiles, std::initializer_list<int32_t> more = {}) const;
  // A folded batch norm's tensor, or the weight in its place (bound, never read).
  const vk::Buffer& folded(const OpTensors& t, const Tensor* FoldedBatchNorm::*member) const;

  Conv2dShape shape_;
  bool has_bias_;
  // The most slices the weight gradient's partial sums have room for (weight_grad_partial).
  int64_t max_slices_ = 1;
};

std::unique_ptr<Op> make_conv2d(const LayerConfig& layer);

}  // namespace tessera
