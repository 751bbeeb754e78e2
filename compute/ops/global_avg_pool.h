// The mean over each plane: [N,C,H,W] -> [N,C], PyTorch's AdaptiveAvgPool2d(1) followed by
// flatten (resnet18's avgpool).
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class GlobalAvgPool : public Op {
 public:
  std::string type() const override { return "global_avg_pool"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  // y[n,c] = mean over h,w of x[n,c,h,w]
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx[n,c,h,w] (+)= dy[n,c] / (H*W)
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t planes_ = 0, plane_ = 0;
};

std::unique_ptr<Op> make_global_avg_pool(const LayerConfig& layer);

}  // namespace tessera
