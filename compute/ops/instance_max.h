// The max over a bag's instances, the pooling of a max multiple-instance head, per feature. The
// bag is padded to a fixed row count so that one recorded step serves bags of any size; `count`
// (u32 [1], on the device) says how many leading rows are instances. Ties go to the first row
// (the smallest index), so the same bag always routes its gradient to the same instance.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class InstanceMax : public Op {
 public:
  std::string type() const override { return "instance_max"; }
  // features [M, D], count u32 [1] -> [1, D]
  Shape infer(const std::vector<Shape>& inputs) override;
  // argmax u32 [D]: the row each feature's max came from, kept for backward (and tile scores).
  std::vector<TensorSpec> tensors() const override;
  // argmax[d] = first n < count with h[n, d] = max over the bag; z[d] = h[argmax[d], d]
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dh[n, d] (+)= n == argmax[d] ? dz[d] : 0
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // Forward reads features past what one binding reaches a window of rows at a time (backward
  // reads no features).
  bool reads_in_windows(size_t input) const override { return input == 0; }

 private:
  int64_t rows_ = 0, width_ = 0;
};

std::unique_ptr<Op> make_instance_max(const LayerConfig& layer);

}  // namespace tessera
