// TransMIL's PPEG, the pyramid position encoding generator (Shao et al. 2021,
// szc19990412/TransMIL models/TransMIL.py): the class token passes, and the sequence's grid of
// instance tokens, laid out as an image of D channels, gains three depthwise convolutions of it
// (7x7, 5x5, 3x3, each with a bias, zero padding k/2) besides itself. The grid's side follows
// the bag's instance count on the device (transmil_sequence.h): the sequence is sized for the
// largest grid and its rows past the bag's 1 + side^2 are zero.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Ppeg : public Op {
 public:
  // The grid's pixels a workgroup of the weight gradient's first pass sums (BLOCK_PIXELS of
  // shaders/ppeg_backward_weight_partial.comp).
  static constexpr int64_t kBlockPixels = 2048;
  std::string type() const override { return "ppeg"; }
  // x [1, 1 + side^2, D], count u32 [1] -> the same shape
  Shape infer(const std::vector<Shape>& inputs) override;
  // proj.weight [D,1,7,7], proj.bias, proj1.weight [D,1,5,5], proj1.bias, proj2.weight [D,1,3,3],
  // proj2.bias (TransMIL's names; PyTorch's Conv2d init: U(-1/k, 1/k) for a depthwise k x k);
  // combined_kernel [D, 50] (prepared: the three kernels as one 7x7 and the summed bias);
  // weight_grad_partial [blocks, D, 50] (backward's scratch: training graphs alone)
  std::vector<TensorSpec> tensors() const override;
  // y[0] = x[0]; y[1 + i*side + j][c] = g + conv7(g) + conv5(g) + conv3(g) + biases, g the grid
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  void prepare(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dx: the class row's dy, the grid's dy plus the transposed convolutions; the kernels' and
  // biases' gradients accumulated
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  struct Push {
    uint32_t width, side, accumulate, blocks;
  };
  Push push(uint32_t accumulate) const;
  int64_t blocks() const { return (side_ * side_ + kBlockPixels - 1) / kBlockPixels; }
  int64_t side_ = 0, width_ = 0;
};

std::unique_ptr<Op> make_ppeg(const LayerConfig& layer);

}  // namespace tessera
