// Softmax cross-entropy with optional class weights, PyTorch's F.cross_entropy(logits, labels,
// weight) with reduction "mean" split into per-sample terms: l[n] = w[y[n]] * -log
// softmax(logits[n])[y[n]] / sum over m of w[y[m]], so that the sum of the output is PyTorch's
// loss. A label outside [0, C) gives NaN rather than a loss that looks plausible.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class SoftmaxCrossEntropy : public Op {
 public:
  std::string type() const override { return "softmax_cross_entropy"; }
  // logits f32 [N,C], labels u32 [N] -> per-sample loss [N]
  Shape infer(const std::vector<Shape>& inputs) override;
  // The per-sample loss stays float whatever the activations.
  DType output_dtype(DType) const override { return DType::f32; }
  // "class_weight" [C], ones unless the run sets it
  std::vector<TensorSpec> tensors() const override;
  // l[n] = w[y[n]] * (logsumexp(logits[n]) - logits[n, y[n]]) / sum_m w[y[m]]
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dlogits[n,c] (+)= dl[n] * w[y[n]] / sum_m w[y[m]] * (softmax(logits[n])[c] - (c == y[n]))
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t samples_ = 0, classes_ = 0;
};

std::unique_ptr<Op> make_softmax_cross_entropy(const LayerConfig& layer);

}  // namespace tessera
