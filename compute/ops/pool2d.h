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
  // Match the specialization and push constants of shaders/pool2d.glsl.
  const vk::Kernel& kernel(vk::Kernels& kernels, const char* name) const;
  struct Push {
    uint32_t count, accumulate;
  };

  int64_t kernel_size_, stride_, padding_;
  Shape input_, output_;
};

}  // namespace tessera
