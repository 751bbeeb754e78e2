// One Linear(D, 1) per class, each on its own class's slice of the input: CLAM-MB's bag
// classifiers (mahmoodlab/CLAM models/model_clam.py at 0266041, CLAM_MB: logits[0, c] =
// classifiers[c](M[c]), M [C, D] the C attention pools). The C classifiers' weights [1, D] are
// held as the rows of one weight [C, D], their biases as one bias [C].
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class ClassLinear : public Op {
 public:
  explicit ClassLinear(int64_t classes) : classes_(classes) {}
  std::string type() const override { return "class_linear"; }
  // x [N, C*D] (attention_pool's C pools one after the other) -> y [N, C]
  Shape infer(const std::vector<Shape>& inputs) override;
  // weight [C, D], bias [C]: U(-1/sqrt(D), 1/sqrt(D)), as PyTorch initialises each Linear(D, 1)
  std::vector<TensorSpec> tensors() const override;
  // y[n, c] = sum_d x[n, c*D + d] weight[c, d] + bias[c]
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx[n, c*D + d] (+)= dy[n, c] weight[c, d]; dweight[c, d] += sum_n dy[n, c] x[n, c*D + d];
  // dbias[c] += sum_n dy[n, c]
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t classes_, width_ = 0, batch_ = 0;
};

std::unique_ptr<Op> make_class_linear(const LayerConfig& layer);

}  // namespace tessera
