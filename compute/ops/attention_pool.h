// Attention pooling of a bag (Ilse et al. 2018): a softmax of per-instance scores over the
// bag, and the instances' sum weighted by it. The bag is padded to a fixed row count so that
// one recorded step serves bags of any size; `count` (u32 [1], on the device) says how many
// leading rows are instances, and padding rows get weight 0.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class AttentionPool : public Op {
 public:
  std::string type() const override { return "attention_pool"; }
  // scores [M, 1], features [M, D], count u32 [1] -> [1, D]
  Shape infer(const std::vector<Shape>& inputs) override;
  // weights [M]: the softmax, kept for backward; instance_grad [M]: scratch of backward.
  std::vector<TensorSpec> tensors() const override;
  // a = softmax(s) over n < count; z[d] = sum_n a[n] h[n, d]
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // g[n] = sum_d dz[d] h[n, d]; ds[n] (+)= a[n] (g[n] - sum_m a[m] g[m]); dh[n, d] (+)= a[n] dz[d]
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t rows_ = 0, width_ = 0;
};

std::unique_ptr<Op> make_attention_pool(const LayerConfig& layer);

}  // namespace tessera
