// Max pooling, PyTorch's nn.MaxPool2d without dilation or ceil_mode.
#pragma once
#include "compute/ops/pool2d.h"

namespace tessera {

class MaxPool2d : public Pool2d {
 public:
  using Pool2d::Pool2d;
  std::string type() const override { return "max_pool2d"; }
  // "argmax": where in its input plane each output came from (the first maximum, as PyTorch).
  std::vector<TensorSpec> tensors() const override;
  // x [N,C,H,W] -> y [N,C,OH,OW], argmax [N,C,OH,OW]
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx[n,c,h,w] (+)= sum of dy over the windows whose argmax is (h,w)
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
};

std::unique_ptr<Op> make_max_pool2d(const LayerConfig& layer);

}  // namespace tessera
