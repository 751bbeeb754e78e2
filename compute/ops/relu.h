// ReLU: y = max(x, 0), elementwise on any shape.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Relu : public Op {
 public:
  std::string type() const override { return "relu"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  // y[i] = max(x[i], 0)
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx[i] (+)= y[i] > 0 ? dy[i] : 0
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  AsEpilogue as_epilogue() const override { return {EpilogueStep::relu}; }

 private:
  int64_t count_ = 0;
};

std::unique_ptr<Op> make_relu(const LayerConfig& layer);

// input_grad[input] (+)= output > 0 ? output_grad : 0 over `count` elements: the ReLU's backward,
// and that of an op with a ReLU fused in whose input reaches its output unchanged (add).
void record_relu_backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, size_t input,
                          int64_t count);

// output_grad = output > 0 ? output_grad : 0 in place: the backward of a ReLU fused into the
// op that wrote `output` (Epilogue::Activation::relu), before that op's own backward reads output_grad.
void record_relu_backward_in_place(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& output,
                                   const Tensor& output_grad);

}  // namespace tessera
