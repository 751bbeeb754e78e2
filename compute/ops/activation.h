// The activations of transformer MLPs, elementwise on any shape: GELU (PyTorch's default erf
// form, nn.GELU()) and SiLU (nn.SiLU); and timm's packed SwiGLU gate. Inference only.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Activation : public InferenceOp {
 public:
  enum class Function { gelu, silu };
  explicit Activation(Function function) : function_(function) {}
  std::string type() const override { return function_ == Function::gelu ? "gelu" : "silu"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  // gelu: y = x/2 (1 + erf(x / sqrt 2)); silu: y = x / (1 + exp(-x))
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // In the store of the linear or conv2d before it (inference only, as this op).
  AsEpilogue as_epilogue() const override {
    return {function_ == Function::gelu ? EpilogueStep::gelu : EpilogueStep::silu};
  }

 private:
  Function function_;
  int64_t count_ = 0;
};

// timm's SwiGLUPacked (GluMlp with gate_last=False) between fc1 and fc2: fc1's output halves
// a | b on the last dimension give silu(a) * b.
class SwiGlu : public InferenceOp {
 public:
  std::string type() const override { return "swiglu"; }
  // x [..., 2H] -> y [..., H]
  Shape infer(const std::vector<Shape>& inputs) override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t count_ = 0, hidden_ = 0;
};

std::unique_ptr<Op> make_gelu(const LayerConfig& layer);
std::unique_ptr<Op> make_silu(const LayerConfig& layer);
std::unique_ptr<Op> make_swiglu(const LayerConfig& layer);

}  // namespace tessera
