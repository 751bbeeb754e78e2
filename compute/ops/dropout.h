// Dropout, PyTorch's nn.Dropout: in training each element is zeroed with probability p and
// the rest scaled by 1/(1-p); in evaluation the identity. The mask is a hash of (the run's
// seed and the layer's name, the optimizer step, the sample's index in the whole batch), so
// backward recomputes it instead of storing it, and K micro-batches draw the same masks as
// one K-times-larger batch.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Dropout : public Op {
 public:
  Dropout(float probability, uint32_t layer_hash) : probability_(probability), layer_hash_(layer_hash) {}
  std::string type() const override { return "dropout"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  // y[i] = keep(i) ? x[i] / (1 - p) : 0
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx[i] (+)= keep(i) ? dy[i] / (1 - p) : 0
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  void record(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, const Tensor& source,
              vk::BufferArg destination, bool accumulate);

  float probability_;
  uint32_t layer_hash_;
  int64_t count_ = 0, per_sample_ = 0;
};

std::unique_ptr<Op> make_dropout(const LayerConfig& layer);

}  // namespace tessera
