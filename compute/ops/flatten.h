// [N, ...] -> [N, product of the rest], PyTorch's nn.Flatten (start_dim 1). NCHW memory is
// already in that order, so both passes are copies.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Flatten : public Op {
 public:
  std::string type() const override { return "flatten"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  // y = x, reshaped
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx (+)= dy, reshaped
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t count_ = 0;
};

std::unique_ptr<Op> make_flatten(const LayerConfig& layer);

}  // namespace tessera
