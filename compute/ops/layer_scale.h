// timm's LayerScale (ls1, ls2 of a block): y = x * gamma over the last dimension. Inference only.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class LayerScale : public InferenceOp {
 public:
  explicit LayerScale(float init) : init_(init) {}
  std::string type() const override { return "layer_scale"; }
  // x [..., D] -> y [..., D]
  Shape infer(const std::vector<Shape>& inputs) override;
  // gamma [D], every value `init` (timm's init_values)
  std::vector<TensorSpec> tensors() const override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // In the store of the linear before it: its output features are the scaled dimension.
  AsEpilogue as_epilogue() const override { return {EpilogueStep::scale}; }

 private:
  float init_;
  int64_t count_ = 0, width_ = 0;
};

std::unique_ptr<Op> make_layer_scale(const LayerConfig& layer);

}  // namespace tessera
