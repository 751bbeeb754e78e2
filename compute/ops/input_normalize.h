// The first layer of every pass over images that a job adds before the model: uint8 pixels as
// loaded (RGB, or a multiplex slide's channels), to the network's float input.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class InputNormalize : public Op {
 public:
  std::string type() const override { return "input_normalize"; }
  // images u8 [N,H,W,C] -> [N,C,H,W]
  Shape infer(const std::vector<Shape>& inputs) override;
  // (rgb/255 - mean) / std with ImageNet's mean and std, the normalisation torchvision's
  // pretrained models expect; other channel counts (x/255 - 0.5) / 0.5.
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // The images take no gradient.
  void backward(vk::Recorder&, vk::Kernels&, const OpTensors&) override {}
};

std::unique_ptr<Op> make_input_normalize(const LayerConfig& layer);

}  // namespace tessera
