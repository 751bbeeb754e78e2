// Tanh, elementwise on any shape, trained (DSMIL's query branch ends in nn.Tanh()).
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Tanh : public Op {
 public:
  std::string type() const override { return "tanh"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  // y[i] = tanh(x[i])
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx[i] (+)= dy[i] (1 - y[i]^2), from the output as PyTorch's tanh_backward
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t count_ = 0;
};

std::unique_ptr<Op> make_tanh(const LayerConfig& layer);

}  // namespace tessera
