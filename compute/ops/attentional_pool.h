// CONCH v1.5's attentional pooler (attn_pool_contrast), as mahmoodlab/TRIDENT's
// trident/patch_encoder_models/model_zoo/conchv1_5/conchv1_5.py AttentionalPooler defines it:
// learned queries [Q, D] (ln_q over them) attend with `heads` heads over every token [N, T, C]
// (ln_k over them): q = to_q(ln_q(query)), (k, v) = to_kv(ln_k(x)).chunk(2), softmax(q k^T /
// sqrt(D / heads)) v per head, then to_out; the three projections have no bias (CONCH v1's open_clip
// pooler, an nn.MultiheadAttention with biases, is another module). LayerNorm eps: nn.LayerNorm's
// default. Output [N, D] for one query (TRIDENT's [:, 0]), else [N, Q, D]. The projections are
// record_gemm's; the normalised keys, the projections, the scores and the attended values are
// float scratch. Inference only.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class AttentionalPool : public InferenceOp {
 public:
  AttentionalPool(int64_t width, int64_t heads, int64_t queries, float eps)
      : width_(width), heads_(heads), queries_(queries), eps_(eps) {}
  std::string type() const override { return "attentional_pool"; }
  // tokens [N, T, C] -> [N, D] (one query) or [N, Q, D]
  Shape infer(const std::vector<Shape>& inputs) override;
  // query [Q, D] (normal, std 1, as torch.randn), ln_k.{weight,bias} [C], ln_q.{weight,bias} [D],
  // to_q.weight [D, D], to_kv.weight [2D, C], to_out.weight [D, D] (nn.Linear's init); then the
  // scratch tensors
  std::vector<TensorSpec> tensors() const override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  double forward_flops() const override;

 private:
  int64_t width_, heads_, queries_;
  float eps_;
  int64_t batch_ = 0, tokens_ = 0, context_ = 0;
};

std::unique_ptr<Op> make_attentional_pool(const LayerConfig& layer);

}  // namespace tessera
