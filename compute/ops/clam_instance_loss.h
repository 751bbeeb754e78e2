// CLAM's instance-level clustering loss (Lu et al. 2021; mahmoodlab/CLAM models/model_clam.py at
// 0266041, CLAM_SB.inst_eval and inst_eval_out, CLAM_MB.forward): for each class c, an instance
// classifier Linear(D, 2) over the k instances of highest attention and the k of lowest. For the
// bag's label class the top k are positives (target 1) and the bottom k negatives (target 0);
// for every other class, only with `subtyping`, the top k are negatives. Each class's term is
// the mean cross-entropy over its rows; the loss is their sum, divided by C with `subtyping`.
// The attention column of class c is column c (CLAM-MB), or column 0 for every class (CLAM-SB).
//
// Where tessera departs from the source, and why:
// - k = min(k_sample, patches): CLAM's torch.topk fails on a bag of fewer than k_sample patches;
//   a bag of one patch has that patch as its top and its bottom instance.
// - Rows are chosen by the raw attention scores; CLAM takes topk of their softmax, which keeps
//   the same order. Ties go to the lowest row first (topk leaves their order unspecified), so the
//   same run chooses the same rows, bit for bit.
// - The chosen rows carry no gradient (topk's indices carry none); the classifiers' loss reaches
//   the features h only at the chosen rows, added once per time a row is chosen.
// The C classifiers' weights [2, D] and biases [2] are held as one weight [C, 2, D] and one bias
// [C, 2]. The bag is padded to a fixed row count; `count` (u32 [1], on the device) says how many
// leading rows are instances. A label outside [0, C) gives NaN, as softmax_cross_entropy does.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

// The most rows a side takes (--k-sample): a select invocation loops k x M / 256 times, which
// llvmpipe allows up to 65535 (k = 64: bags of up to 260,000 patches).
constexpr int64_t kMaxKSample = 64;

class ClamInstanceLoss : public Op {
 public:
  ClamInstanceLoss(int64_t classes, int64_t k_sample, bool subtyping)
      : classes_(classes), k_sample_(k_sample), subtyping_(subtyping) {}
  std::string type() const override { return "clam_instance_loss"; }
  // attention scores [M, 1 or C], features h [M, D], count u32 [1], labels u32 [1] -> loss [1]
  Shape infer(const std::vector<Shape>& inputs) override;
  DType output_dtype(DType) const override { return DType::f32; }
  // weight [C, 2, D], bias [C, 2]: U(-1/sqrt(D), 1/sqrt(D)) as PyTorch's Linear(D, 2). Saved for
  // backward, a slot per chosen row (C classes x (k_sample top, k_sample bottom)): selected u32
  // (the row, or ~0 where the slot is unused), row_grads [slots, 2] (the slot's share of the loss
  // times the softmax less the target: d loss / d logits), row_losses [slots].
  std::vector<TensorSpec> tensors() const override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dweight[c] += dl sum over c's slots of row_grads[s] h[selected[s]]^T; dbias[c] += dl sum of
  // row_grads; dh[n] (+)= dl sum over slots s with selected[s] = n of weight[c(s)]^T row_grads[s];
  // the scores, count and labels get none (zeros where this op writes the scores' gradient first).
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t slots() const { return classes_ * 2 * k_sample_; }
  int64_t classes_, k_sample_;
  bool subtyping_;
  int64_t rows_ = 0, width_ = 0, columns_ = 1;
};

std::unique_ptr<Op> make_clam_instance_loss(const LayerConfig& layer);

}  // namespace tessera
