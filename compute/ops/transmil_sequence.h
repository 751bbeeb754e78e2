// TransMIL's token sequence (Shao et al. 2021, szc19990412/TransMIL models/TransMIL.py): the
// class token, then the bag's n instances on a side x side grid, the least side with
// side^2 >= n, the grid's last side^2 - n cells filled by the first instances again
// (cat([h, h[:add_length]])). The bag is padded to M rows so that one recorded step serves bags
// of any size; `count` (u32 [1], on the device) holds n, and every kernel derives the side from
// it (shaders/transmil_grid.glsl): the sequence is sized for the largest side, its rows past
// 1 + side^2 zero.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

// The side of the square grid of `instances` TransMIL tokens: the least side with
// side * side >= instances (TransMIL's ceil(sqrt(n)), in whole numbers).
int64_t transmil_grid_side(int64_t instances);

class TransmilSequence : public Op {
 public:
  std::string type() const override { return "transmil_sequence"; }
  // h [M, D], count u32 [1] -> [1, 1 + side(M)^2, D]
  Shape infer(const std::vector<Shape>& inputs) override;
  // cls_token [1, 1, D] (TransMIL's own name, no layer prefix; torch.randn: normal, std 1)
  std::vector<TensorSpec> tensors() const override;
  // y[0] = cls_token; y[1 + r] = h[r < n ? r : r - n] for r < side^2; zeros after
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dh[r] (+)= r < n ? dy[1 + r] + (r < side^2 - n ? dy[1 + n + r] : 0) : 0; dcls_token += dy[0]
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  int64_t rows_ = 0, width_ = 0, sequence_rows_ = 0;
};

std::unique_ptr<Op> make_transmil_sequence(const LayerConfig& layer);

}  // namespace tessera
