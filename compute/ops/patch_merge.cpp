#include "compute/ops/patch_merge.h"

namespace tessera {

namespace {
struct Push {
  uint32_t count, channels, grid_height, grid_width;
};
}  // namespace

std::unique_ptr<Op> make_patch_merge(const LayerConfig& layer) {
  return std::make_unique<PatchMerge>(layer.integer("grid_height", std::nullopt, 1, kMaxLayerInteger),
                                      layer.integer("grid_width", std::nullopt, 1, kMaxLayerInteger));
}

Shape PatchMerge::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 3)
    throw ShapeError("patch_merge takes tokens [batch, tokens, features]");
  if (inputs[0][1] != grid_height_ * grid_width_)
    throw ShapeError("patch_merge: " + std::to_string(inputs[0][1]) + " tokens are not the " +
                     std::to_string(grid_height_) + " x " + std::to_string(grid_width_) + " grid");
  if (grid_height_ % 2 != 0 || grid_width_ % 2 != 0)
    throw ShapeError("patch_merge: the " + std::to_string(grid_height_) + " x " + std::to_string(grid_width_) +
                     " grid is not even (timm 0.5.4's PatchMerging asserts it)");
  batch_ = inputs[0][0];
  channels_ = inputs[0][2];
  return {batch_, grid_height_ / 2 * (grid_width_ / 2), 4 * channels_};
}

void PatchMerge::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const auto count = static_cast<uint32_t>(t.output->count());
  auto kernel = kernel_for<Push>(kernels, vk::kernel::patch_merge_forward, *t.output, {kElementwiseGroup});
  recorder.dispatch_elements(kernel, {reads(*t.inputs[0]), writes(*t.output)},
                             Push{count, static_cast<uint32_t>(channels_), static_cast<uint32_t>(grid_height_),
                                  static_cast<uint32_t>(grid_width_)},
                             count, kElementwiseGroup);
}

}  // namespace tessera
