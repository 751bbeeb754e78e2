// What max and average pooling share: a square window (PyTorch's kernel_size, stride that
// defaults to the kernel size, padding; floor rounding) over the planes of an NCHW tensor.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class Pool2d : public Op {
 public:
  explicit Pool2d(const LayerConfig& layer);
  Shape infer(const std::vector<Shape>& inputs) override;

 protected:
  // Match the specialization and push constants of shaders/pool2d.glsl; backward kernels also
  // take whether the windows tile the input.
  struct Push {
    uint32_t count, accumulate;
  };
  vk::Pipeline<Push> kernel(vk::Kernels& kernels, const vk::ActivationKernel& kernel, const Tensor& activation,
                            bool backward) const;
  // The windows cover the input exactly once (stride = kernel, no padding, no remainder):
  // backward then scatters per window instead of gathering per input element.
  bool windows_tile_input() const;
  // The elements a backward dispatch covers: windows where they tile the input, else inputs.
  int64_t backward_count() const;

  int64_t kernel_size_, stride_, padding_;
  Shape input_, output_;
};

}  // namespace tessera
