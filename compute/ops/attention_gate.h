// The gate of gated attention (Ilse et al. 2018): tanh(V h) * sigmoid(U h), elementwise, from
// the outputs of the two linear layers V and U.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class AttentionGate : public Op {
 public:
  std::string type() const override { return "attention_gate"; }
  // a [M, L], b [M, L] -> [M, L]
  Shape infer(const std::vector<Shape>& inputs) override;
  // y = tanh(a) * sigmoid(b)
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // da (+)= dy (1 - tanh(a)^2) sigmoid(b); db (+)= dy tanh(a) sigmoid(b) (1 - sigmoid(b))
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t count_ = 0;
};

std::unique_ptr<Op> make_attention_gate(const LayerConfig& layer);

}  // namespace tessera
