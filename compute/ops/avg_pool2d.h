// Average pooling, PyTorch's nn.AvgPool2d with its defaults: padding counts as zeros in the
// average (count_include_pad), floor rounding, so every window divides by kernel_size^2.
#pragma once
#include "compute/ops/pool2d.h"

namespace tessera {

class AvgPool2d : public Pool2d {
 public:
  using Pool2d::Pool2d;
  std::string type() const override { return "avg_pool2d"; }
  // x [N,C,H,W] -> y [N,C,OH,OW]
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx[n,c,h,w] (+)= sum of dy over the windows that cover (h,w), / kernel_size^2
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
};

std::unique_ptr<Op> make_avg_pool2d(const LayerConfig& layer);

}  // namespace tessera
