// Multi-head self-attention, fused: softmax(q k^T / sqrt(head_dim)) v per image and head from
// the packed projection [N, T, 3D] (timm's attn.qkv, torchvision's in_proj), in one kernel that
// keeps the softmax in float and never stores the T x T scores (flash attention's tiling).
// The projections around it are linear layers. Its tiles are gemm_tiles' for the score block
// (queries its rows, keys its columns). Inference only.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Attention : public InferenceOp {
 public:
  explicit Attention(int64_t heads) : heads_(heads) {}
  std::string type() const override { return "attention"; }
  // qkv [N, T, 3D] -> [N, T, D], D = heads * head_dim
  Shape infer(const std::vector<Shape>& inputs) override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  double forward_flops() const override;

 private:
  int64_t heads_, batch_ = 0, tokens_ = 0, head_dim_ = 0;
};

std::unique_ptr<Op> make_attention(const LayerConfig& layer);

}  // namespace tessera
