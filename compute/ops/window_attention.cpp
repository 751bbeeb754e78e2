#include "compute/ops/window_attention.h"

#include <cmath>

namespace tessera {

namespace {
struct Push {
  uint32_t count, heads, window, shift, grid_height, grid_width;
  float scale;
};
// The kernel holds a query's head and its running output in registers (Swin's heads are 32).
constexpr int64_t kMaxHeadDim = 256;
// Swin's windows are 7 (12 for its 384-pixel models); the table holds (2w - 1)^2 rows.
constexpr int64_t kMaxWindow = 64;
}  // namespace

std::unique_ptr<Op> make_window_attention(const LayerConfig& layer) {
  WindowAttention::Geometry g{};
  g.heads = layer.integer("heads", std::nullopt, 1, kMaxLayerInteger);
  g.window = layer.integer("window", std::nullopt, 1, kMaxWindow);
  g.shift = layer.integer("shift", 0, 0, kMaxWindow);
  if (g.shift >= g.window) layer.fail("shift", "must be below window " + std::to_string(g.window) + " (timm asserts 0 <= shift < window)");
  g.grid_height = layer.integer("grid_height", std::nullopt, 1, kMaxLayerInteger);
  g.grid_width = layer.integer("grid_width", std::nullopt, 1, kMaxLayerInteger);
  return std::make_unique<WindowAttention>(g);
}

Shape WindowAttention::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 3)
    throw ShapeError("window_attention takes the packed projection [batch, tokens, 3 * width]");
  const Shape& qkv = inputs[0];
  if (qkv[1] != g_.grid_height * g_.grid_width)
    throw ShapeError("window_attention: " + std::to_string(qkv[1]) + " tokens are not the " +
                     std::to_string(g_.grid_height) + " x " + std::to_string(g_.grid_width) + " grid");
  if (g_.grid_height % g_.window != 0 || g_.grid_width % g_.window != 0)
    throw ShapeError("window_attention: the " + std::to_string(g_.grid_height) + " x " + std::to_string(g_.grid_width) +
                     " grid is not a multiple of the window " + std::to_string(g_.window) +
                     " (timm 0.5.4's Swin neither pads nor crops)");
  if (qkv[2] % (3 * g_.heads) != 0)
    throw ShapeError("window_attention: " + std::to_string(qkv[2]) + " features are not 3 x " +
                     std::to_string(g_.heads) + " heads of equal size");
  batch_ = qkv[0];
  head_dim_ = qkv[2] / (3 * g_.heads);
  if (head_dim_ > kMaxHeadDim)
    throw ShapeError("window_attention: heads of " + std::to_string(head_dim_) + " features (at most " +
                     std::to_string(kMaxHeadDim) + ")");
  return {batch_, qkv[1], g_.heads * head_dim_};
}

std::vector<TensorSpec> WindowAttention::tensors() const {
  const int64_t span = 2 * g_.window - 1;
  return {{"relative_position_bias_table", {span * span, g_.heads}, TensorRole::parameter, DType::f32,
           {Init::normal, 0.02f}}};
}

double WindowAttention::forward_flops() const {
  // Each token's query against the window's keys, and the weighted sum of their values.
  return 4.0 * static_cast<double>(batch_ * g_.grid_height * g_.grid_width * g_.window * g_.window * g_.heads * head_dim_);
}

void WindowAttention::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  // One invocation per (image, token, head), neighbouring invocations the heads of one token.
  const auto count = static_cast<uint32_t>(batch_ * g_.grid_height * g_.grid_width * g_.heads);
  auto kernel = kernel_for<Push>(kernels, vk::kernel::window_attention_forward, *t.output,
                                 {kElementwiseGroup, static_cast<int32_t>(head_dim_)});
  recorder.dispatch_elements(
      kernel, {reads(*t.inputs[0]), reads(*t.tensors[0]), writes(*t.output)},
      Push{count, static_cast<uint32_t>(g_.heads), static_cast<uint32_t>(g_.window), static_cast<uint32_t>(g_.shift),
           static_cast<uint32_t>(g_.grid_height), static_cast<uint32_t>(g_.grid_width),
           static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim_)))},
      count, kElementwiseGroup);
}

}  // namespace tessera
