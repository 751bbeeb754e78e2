// Elementwise sum of two tensors of the same shape: the join of a residual block.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Add : public Op {
 public:
  std::string type() const override { return "add"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  // y[i] = a[i] + b[i] (then max(y, 0) with a fused ReLU, OpTensors::epilogue)
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // da[i] (+)= dy[i], db[i] (+)= dy[i] (where y > 0 with a fused ReLU)
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  EpilogueSteps fusions() const override { return {EpilogueStep::relu}; }
  // In the store of a GEMM-like op that computes one input: that op adds the other.
  AsEpilogue as_epilogue() const override { return {EpilogueStep::residual}; }

 private:
  int64_t count_ = 0;
};

std::unique_ptr<Op> make_add(const LayerConfig& layer);

// dx (+)= dy over `count` elements: the backward pass of every op whose output is its input
// reshaped or summed (add, flatten).
void record_pass_through_grad(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, size_t input,
                              int64_t count);

}  // namespace tessera
