#include "compute/ops/pool2d.h"

namespace tessera {

Pool2d::Pool2d(const LayerConfig& layer)
    : kernel_size_(layer.integer("kernel_size", std::nullopt, 1)),
      stride_(layer.integer("stride", kernel_size_, 1)),
      padding_(layer.integer("padding", 0)) {
  // As in PyTorch: a window that lies wholly in the padding would have no input to pool.
  if (2 * padding_ > kernel_size_) layer.fail("padding", "must be at most half of kernel_size");
}

Shape Pool2d::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 4)
    throw ShapeError(type() + " takes one NCHW input, got " + (inputs.empty() ? "none" : to_string(inputs[0])));
  input_ = inputs[0];
  int64_t padded_h = input_[2] + 2 * padding_, padded_w = input_[3] + 2 * padding_;
  if (padded_h < kernel_size_ || padded_w < kernel_size_)
    throw ShapeError(type() + ": input " + to_string(input_) + " with padding " + std::to_string(padding_) +
                     " is smaller than the window " + std::to_string(kernel_size_));
  output_ = {input_[0], input_[1], (padded_h - kernel_size_) / stride_ + 1, (padded_w - kernel_size_) / stride_ + 1};
  return output_;
}

bool Pool2d::windows_tile_input() const {
  return stride_ == kernel_size_ && padding_ == 0 && output_[2] * kernel_size_ == input_[2] &&
         output_[3] * kernel_size_ == input_[3];
}

int64_t Pool2d::backward_count() const { return element_count(windows_tile_input() ? output_ : input_); }

vk::Pipeline<Pool2d::Push> Pool2d::kernel(vk::Kernels& kernels, const vk::ActivationKernel& kernel,
                                          const Tensor& activation, bool backward) const {
  auto i = [](int64_t v) { return static_cast<int32_t>(v); };
  std::vector<int32_t> constants{i(kElementwiseGroup), i(input_[2]),      i(input_[3]), i(output_[2]),
                                 i(output_[3]),        i(kernel_size_), i(stride_),   i(padding_)};
  if (backward) constants.push_back(windows_tile_input() ? 1 : 0);
  return kernel_for<Push>(kernels, kernel, activation, constants);
}

}  // namespace tessera
