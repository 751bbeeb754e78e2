// Swin's window attention (W-MSA and SW-MSA), as timm 0.5.4's swin_transformer.py
// SwinTransformerBlock.forward and WindowAttention define it (the model CTransPath is): the
// tokens of an image [N, H * W] on their H x W grid, cyclically shifted by -shift in both
// directions (torch.roll), cut into window x window windows; in each window, per head,
// softmax(q k^T / sqrt(head_dim) + relative_position_bias + mask) v, where the bias is
// relative_position_bias_table[relative_position_index] (the index of a query-key pair:
// (dy + w - 1) * (2w - 1) + (dx + w - 1), dy and dx the query's window coordinates less the
// key's) and the mask adds -100 between tokens of different regions of the shifted grid (the
// img_mask slices (0, -w), (-w, -shift), (-shift, None) of each axis); then the windows put back
// and the shift undone. The input is the packed qkv projection in raster order [N, H * W, 3C] and
// the output [N, H * W, C] is in raster order too: the linear layers before and after act on each
// token alone, so they run before and after the permutation, which is index arithmetic in the
// kernel (neither the shifted grid, the windows nor the mask are stored). relative_position_index
// and attn_mask, buffers in timm's module, are derived here, never read. timm 0.5.4 neither pads
// nor crops: a grid that is not a multiple of the window fails its window_partition, and is
// refused here (ShapeError). Inference only.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class WindowAttention : public InferenceOp {
 public:
  struct Geometry {
    int64_t heads, window, shift, grid_height, grid_width;
  };
  explicit WindowAttention(Geometry geometry) : g_(geometry) {}
  std::string type() const override { return "window_attention"; }
  // qkv [N, H * W, 3C] -> [N, H * W, C]
  Shape infer(const std::vector<Shape>& inputs) override;
  // relative_position_bias_table [(2w - 1)^2, heads] (timm's trunc_normal_ std 0.02; normal here)
  std::vector<TensorSpec> tensors() const override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  double forward_flops() const override;

 private:
  Geometry g_;
  int64_t batch_ = 0, head_dim_ = 0;
};

std::unique_ptr<Op> make_window_attention(const LayerConfig& layer);

}  // namespace tessera
