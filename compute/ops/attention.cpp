#include "compute/ops/attention.h"

#include <algorithm>
#include <cmath>

#include "compute/ops/gemm.h"

namespace tessera {

namespace {
struct Push {
  uint32_t tokens, heads;
  float scale;
};
constexpr int64_t kMaxHeadDim = 256;  // the kernel holds a query's head in registers
}  // namespace

std::unique_ptr<Op> make_attention(const LayerConfig& layer) {
  return std::make_unique<Attention>(layer.integer("heads", std::nullopt, 1));
}

Shape Attention::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 3)
    throw ShapeError("attention takes the packed projection [batch, tokens, 3 * width]");
  const Shape& qkv = inputs[0];
  if (qkv[2] % (3 * heads_) != 0)
    throw ShapeError("attention: " + std::to_string(qkv[2]) + " features are not 3 x " + std::to_string(heads_) +
                     " heads of equal size");
  batch_ = qkv[0];
  tokens_ = qkv[1];
  head_dim_ = qkv[2] / (3 * heads_);
  if (head_dim_ > kMaxHeadDim)
    throw ShapeError("attention: heads of " + std::to_string(head_dim_) + " features (at most " +
                     std::to_string(kMaxHeadDim) + ")");
  if (batch_ > 65535 || heads_ > 65535) throw ShapeError("attention: at most 65535 images and heads per dispatch");
  return {batch_, tokens_, heads_ * head_dim_};
}

double Attention::forward_flops() const {
  // q k^T and the weighted sum of v: 2 T^2 head_dim each, per image and head.
  return 4.0 * static_cast<double>(batch_ * heads_ * tokens_ * tokens_ * head_dim_);
}

void Attention::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  // Queries are the rows of the score block, keys its columns, the head its reduction.
  GemmTiles tiles = gemm_tiles(kernels.tile_target(), tokens_);
  auto kernel = kernel_for<Push>(
      kernels, vk::kernel::attention_forward, *t.output,
      {tiles.group, tiles.rows, tiles.columns, tiles.share_columns ? 1 : 0,
       std::min<int32_t>(tiles.reduction_unroll, static_cast<int32_t>(head_dim_)), static_cast<int32_t>(head_dim_)});
  auto queries_per_group = static_cast<int64_t>(tiles.group) * tiles.rows;
  recorder.dispatch(kernel, {reads(*t.inputs[0]), writes(*t.output)},
                    Push{static_cast<uint32_t>(tokens_), static_cast<uint32_t>(heads_),
                         static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim_)))},
                    static_cast<uint32_t>((tokens_ + queries_per_group - 1) / queries_per_group),
                    static_cast<uint32_t>(heads_), static_cast<uint32_t>(batch_));
}

}  // namespace tessera
