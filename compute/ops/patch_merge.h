// Swin's PatchMerging gather (timm 0.5.4): tokens [N, H * W, C] on an H x W grid -> [N, H/2 * W/2,
// 4C], each output token the concatenation of its 2 x 2 neighbours in timm's order x0 (even row,
// even column), x1 (odd row, even column), x2 (even row, odd column), x3 (odd row, odd column).
// Its LayerNorm(4C) and bias-free Linear(4C, 2C) are the graph's layer_norm and linear. timm 0.5.4
// asserts an even grid; so does this (ShapeError). Inference only.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class PatchMerge : public InferenceOp {
 public:
  PatchMerge(int64_t grid_height, int64_t grid_width) : grid_height_(grid_height), grid_width_(grid_width) {}
  std::string type() const override { return "patch_merge"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t grid_height_, grid_width_, batch_ = 0, channels_ = 0;
};

std::unique_ptr<Op> make_patch_merge(const LayerConfig& layer);

}  // namespace tessera
