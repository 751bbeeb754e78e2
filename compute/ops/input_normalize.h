// The first layer of every pass over images that a job adds before the model: uint8 pixels as
// loaded (RGB, or a multiplex slide's channels), to the network's float input.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class InputNormalize : public Op {
 public:
  InputNormalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {}
  std::string type() const override { return "input_normalize"; }
  // images u8 [N,H,W,C] -> [N,C,H,W]
  Shape infer(const std::vector<Shape>& inputs) override;
  // (rgb/255 - mean) / std per channel: "mean" and "std" of the layer, else ImageNet's (what
  // torchvision's pretrained models and most patch encoders expect); other channel counts
  // (x/255 - 0.5) / 0.5.
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // The images take no gradient.
  void backward(vk::Recorder&, vk::Kernels&, const OpTensors&) override {}

 private:
  std::vector<double> mean_, std_;
};

std::unique_ptr<Op> make_input_normalize(const LayerConfig& layer);

// A layer's "mean" and "std" (3 each, ImageNet's where absent), checked: a std of 1e-300 turns
// every feature into NaN, so each mean must lie within [-1000, 1000] and each std within
// [0.001, 1000] (real ones are near 0.5 and 0.2 for pixels in [0, 1]); fails naming the field.
struct Normalisation {
  std::vector<double> mean, std;
};
Normalisation read_normalisation(const LayerConfig& layer);

}  // namespace tessera
