// DSMIL's attention to the critical instance (Li et al. 2021, binli123/dsmil-wsi dsmil.py at
// 80465ed, BClassifier.forward): for each class c the critical instance m_c is the instance whose
// instance-classifier logit of c is the largest in the bag, and every instance n scores
// <Q[n], Q[m_c]> / sqrt(K) against it, where Q holds the instances' queries. DSMIL computes
// q_max = q(feats[m_c]); q acts row by row, so that is row m_c of Q = q(feats), with the same
// value and gradient. The argmax carries no gradient (torch.sort's indices carry none); a tie
// goes to the first instance (torch.sort is not stable on ties: tessera picks the smallest index,
// so a bag always attends to the same instance). The bag is padded to a fixed row count; `count`
// (u32 [1], on the device) says how many leading rows are instances, and padding rows score 0.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class CriticalInstanceScores : public Op {
 public:
  std::string type() const override { return "critical_instance_scores"; }
  // queries Q [M, K], instance logits [M, C], count u32 [1] -> scores [M, C]
  Shape infer(const std::vector<Shape>& inputs) override;
  // critical u32 [C]: m_c, kept for backward; gathered [C*K]: scratch of backward.
  std::vector<TensorSpec> tensors() const override;
  // m_c = the first n < count with the largest logits[n, c]; s[n, c] = <Q[n], Q[m_c]> / sqrt(K)
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dQ[n] (+)= sum_c ds[n, c] Q[m_c] / sqrt(K) + sum over c with m_c = n of sum_n' ds[n', c] Q[n'] / sqrt(K);
  // the logits get none (zeros, or nothing added).
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t rows_ = 0, width_ = 0, classes_ = 0;
};

std::unique_ptr<Op> make_critical_instance_scores(const LayerConfig& layer);

}  // namespace tessera
