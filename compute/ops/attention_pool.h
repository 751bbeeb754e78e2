// Attention pooling of a bag (Ilse et al. 2018): a softmax of per-instance scores over the
// bag, and the instances' sum weighted by it; with C score columns, C such pools of the same
// instances (DSMIL's B = A^T V, CLAM-MB's one branch a class). The bag is padded to a fixed row
// count so that one recorded step serves bags of any size; `count` (u32 [1], on the device) says
// how many leading rows are instances, and padding rows get weight 0.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class AttentionPool : public Op {
 public:
  std::string type() const override { return "attention_pool"; }
  // scores [M, C], features [M, D], count u32 [1] -> [1, C*D]: the C pooled vectors one after
  // the other (DSMIL's B [C, D] as one row; C = 1: ABMIL's [1, D])
  Shape infer(const std::vector<Shape>& inputs) override;
  // weights [C*M]: the softmax, column c at c*M, kept for backward; instance_grad [C*M]: scratch
  // of backward.
  std::vector<TensorSpec> tensors() const override;
  // a[c] = softmax(s[:, c]) over n < count; z[c*D + d] = sum_n a[c, n] h[n, d]
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // g[c, n] = sum_d dz[c*D + d] h[n, d]; ds[n, c] (+)= a[c, n] (g[c, n] - sum_m a[c, m] g[c, m]);
  // dh[n, d] (+)= sum_c a[c, n] dz[c*D + d]
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // Both passes read features past what one binding reaches a window of rows at a time (a bag's
  // features, which ABMIL and DSMIL pool directly).
  bool reads_in_windows(size_t input) const override { return input == 1; }

 private:
  int64_t rows_ = 0, width_ = 0, columns_ = 1;
};

std::unique_ptr<Op> make_attention_pool(const LayerConfig& layer);

}  // namespace tessera
