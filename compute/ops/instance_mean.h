// The mean over a bag's instances, the pooling of a mean multiple-instance head. The bag is
// padded to a fixed row count so that one recorded step serves bags of any size; `count`
// (u32 [1], on the device) says how many leading rows are instances.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class InstanceMean : public Op {
 public:
  std::string type() const override { return "instance_mean"; }
  // features [M, D], count u32 [1] -> [1, D]
  Shape infer(const std::vector<Shape>& inputs) override;
  // z[d] = sum over n < count of h[n, d] / count
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dh[n, d] (+)= n < count ? dz[d] / count : 0
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // Forward reads features past what one binding reaches a window of rows at a time (backward
  // reads no features).
  bool reads_in_windows(size_t input) const override { return input == 0; }

 private:
  int64_t rows_ = 0, width_ = 0;
};

std::unique_ptr<Op> make_instance_mean(const LayerConfig& layer);

}  // namespace tessera
