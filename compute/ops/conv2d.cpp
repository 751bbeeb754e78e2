#include "compute/ops/conv2d.h"

#include <algorithm>
#include <cmath>

#include "compute/ops/gemm.h"
#include "compute/ops/relu.h"

namespace tessera {

namespace {
// Split-K for the weight gradient: enough slices that a small weight still makes this many
// workgroups (a GPU's multiprocessors each hold several; a CPU's cores want fewer), each slice
// long enough to be worth a launch, and the partial sums bounded (one backward scratch buffer).
constexpr int64_t kTargetBlocksGpu = 1024, kTargetBlocksCpu = 128, kMinSliceLength = 512;
constexpr int64_t kMaxPartialElements = int64_t{4} << 20;
// Forward reads the weight as [ceil(K / kWeightBlock), O, kWeightBlock] (K = C*KH*KW); the
// shaders take the block as a specialization constant.
constexpr int32_t kWeightBlock = 16;
}  // namespace

std::unique_ptr<Op> make_conv2d(const LayerConfig& layer) {
  if (layer.integer("groups", 1, 1) != 1) layer.fail("groups", "must be 1 (grouped convolutions are not supported)");
  bool split = layer.json().contains("kernel_h") || layer.json().contains("kernel_w");
  int64_t kernel_h = split ? layer.integer("kernel_h", std::nullopt, 1) : layer.integer("kernel", std::nullopt, 1);
  int64_t kernel_w = split ? layer.integer("kernel_w", std::nullopt, 1) : kernel_h;
  return std::make_unique<Conv2d>(layer.integer("out_channels", std::nullopt, 1), kernel_h, kernel_w,
                                  layer.integer("stride", 1, 1), layer.integer("padding", 0, 0),
                                  layer.boolean("bias", true));
}

Conv2d::Conv2d(int64_t out_channels, int64_t kernel_h, int64_t kernel_w, int64_t stride, int64_t padding, bool bias)
    : has_bias_(bias) {
  shape_.out_channels = out_channels;
  shape_.kernel_h = kernel_h;
  shape_.kernel_w = kernel_w;
  shape_.stride = stride;
  shape_.padding = padding;
}

Shape Conv2d::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1) throw ShapeError("conv2d takes one input");
  const Shape& x = inputs[0];
  if (x.size() != 4) throw ShapeError("conv2d takes [N,C,H,W], got " + to_string(x));
  Conv2dShape& s = shape_;
  s.batch = x[0];
  s.in_channels = x[1];
  s.height = x[2];
  s.width = x[3];
  if (s.height + 2 * s.padding < s.kernel_h || s.width + 2 * s.padding < s.kernel_w)
    throw ShapeError("conv2d: input " + to_string(x) + " with padding " + std::to_string(s.padding) +
                     " is smaller than the kernel " + std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w));
  // The weight gradient's columns; checked before any product of the shape is taken.
  int64_t columns = 0;
  if (__builtin_mul_overflow(s.in_channels, s.kernel_h * s.kernel_w, &columns) || columns > kMaxGemmDimension)
    throw ShapeError("conv2d: " + std::to_string(s.in_channels) + " input channels of a " + std::to_string(s.kernel_h) +
                     "x" + std::to_string(s.kernel_w) + " kernel, more than " + std::to_string(kMaxGemmDimension) +
                     " weights an output channel");
  s.out_height = (s.height + 2 * s.padding - s.kernel_h) / s.stride + 1;
  s.out_width = (s.width + 2 * s.padding - s.kernel_w) / s.stride + 1;

  int64_t reduction = s.batch * s.out_height * s.out_width;
  int64_t weights = s.out_channels * s.in_channels * s.kernel_h * s.kernel_w;
  max_slices_ = std::max<int64_t>(std::min(reduction / kMinSliceLength, kMaxPartialElements / weights), 1);
  return {s.batch, s.out_channels, s.out_height, s.out_width};
}

std::vector<TensorSpec> Conv2d::tensors() const {
  const Conv2dShape& s = shape_;
  float bound = 1.0f / std::sqrt(static_cast<float>(s.in_channels * s.kernel_h * s.kernel_w));
  std::vector<TensorSpec> specs{{"weight", {s.out_channels, s.in_channels, s.kernel_h, s.kernel_w},
                                 TensorRole::parameter, DType::f32, {Init::uniform, bound}}};
  // Inference reads it once, in prepare() (through texels of its own type); the blocked copy is float.
  specs[0].follows_weight_dtype = true;
  if (has_bias_) specs.push_back({"bias", {s.out_channels}, TensorRole::parameter, DType::f32, {Init::uniform, bound}});
  int64_t weight_blocks = (s.in_channels * s.kernel_h * s.kernel_w + kWeightBlock - 1) / kWeightBlock;
  specs.push_back({"weight_blocked", {weight_blocks, s.out_channels, kWeightBlock}, TensorRole::prepared});
  if (max_slices_ > 1) {
    TensorSpec partial{"weight_grad_partial", {max_slices_, s.out_channels, s.in_channels * s.kernel_h * s.kernel_w},
                       TensorRole::saved};
    partial.training_only = partial.pass_scratch = true;
    specs.push_back(partial);
  }
  return specs;
}

double Conv2d::forward_flops() const {
  const Conv2dShape& s = shape_;
  return 2.0 * static_cast<double>(s.batch * s.out_channels * s.out_height * s.out_width) *
         static_cast<double>(s.in_channels * s.kernel_h * s.kernel_w);
}

Conv2d::Push Conv2d::push(bool accumulate, float eps, int64_t slice_length) const {
  const Conv2dShape& s = shape_;
  auto u = [](int64_t v) { return static_cast<uint32_t>(v); };
  return {u(s.batch),      u(s.in_channels), u(s.height),        u(s.width),       u(s.out_channels), u(s.out_height),
          u(s.out_width), u(s.padding),     u(slice_length), accumulate ? 1u : 0u, has_bias_ ? 1u : 0u, eps,
          0,              0,                u(s.kernel_h),   u(s.kernel_w)};
}

ReductionSlices Conv2d::weight_grad_slicing(const vk::TileTarget& target, const GemmTiles& tiles) const {
  const Conv2dShape& s = shape_;
  int64_t reduction = s.batch * s.out_height * s.out_width;
  int64_t blocks = ((s.out_channels + tiles.rows_per_group() - 1) / tiles.rows_per_group()) *
                   ((s.in_channels * s.kernel_h * s.kernel_w + tiles.columns_per_group() - 1) / tiles.columns_per_group());
  int64_t target_blocks = target.cpu_like() ? kTargetBlocksCpu : kTargetBlocksGpu;
  return reduction_slices(reduction, std::clamp<int64_t>((target_blocks + blocks - 1) / blocks, 1, max_slices_));
}

std::vector<int32_t> Conv2d::constants(const GemmTiles& tiles) const {
  return {tiles.group, tiles.rows, tiles.columns, static_cast<int32_t>(shape_.stride), tiles.share_columns ? 1 : 0,
          tiles.reduction_unroll};
}

std::vector<int32_t> Conv2d::forward_constants(const GemmTiles& tiles, const Epilogue& epilogue) const {
  std::vector<int32_t> all = constants(tiles);
  all.insert(all.end(), {kWeightBlock, epilogue.batch_norm ? 1 : 0});
  return with_epilogue_constants(std::move(all), epilogue);
}

std::vector<int32_t> Conv2d::tiled_constants(const GemmTiles& tiles, std::initializer_list<int32_t> more) const {
  std::vector<int32_t> all = tiles.tiled_constants();
  all.insert(all.end(), {static_cast<int32_t>(shape_.kernel_h), static_cast<int32_t>(shape_.kernel_w),
                         static_cast<int32_t>(shape_.stride)});
  all.insert(all.end(), more);
  return all;
}

namespace {
uint32_t blocks(int64_t count, int64_t per_block) { return static_cast<uint32_t>((count + per_block - 1) / per_block); }
}  // namespace

// Without a folded batch norm, its bindings take the weight, which the kernels leave unread.
const vk::Buffer& Conv2d::folded(const OpTensors& t, const Tensor* FoldedBatchNorm::*member) const {
  return t.epilogue.batch_norm ? (t.epilogue.batch_norm->*member)->buffer() : t.tensors[0]->buffer();
}

void Conv2d::prepare(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Conv2dShape& s = shape_;
  // The weight in the layout that the forward kernel reads, scaled by a folded batch norm.
  record_blocked_weight(recorder, kernels, *t.tensors[0], *t.tensors[has_bias_ ? 2 : 1],
                        static_cast<uint32_t>(s.out_channels),
                        static_cast<uint32_t>(s.in_channels * s.kernel_h * s.kernel_w), kWeightBlock, t.epilogue.batch_norm);
}

void Conv2d::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Conv2dShape& s = shape_;
  GemmTiles tiles = gemm_tiles(kernels.tile_target(), s.out_channels);
  bool tiled = tiles.kind == GemmKind::shared_memory;
  auto [groups_y, groups_z] = column_groups(blocks(s.batch * s.out_height * s.out_width, tiles.columns_per_group()));
  // Training re-blocks the weight every pass (a pass over the weight, a rounding error beside
  // the convolution); inference did it once, when the weights were loaded.
  if (!t.prepared) prepare(recorder, kernels, t);
  const vk::Buffer& blocked = t.tensors[has_bias_ ? 2 : 1]->buffer();
  const FoldedBatchNorm* fold = t.epilogue.batch_norm;
  auto kernel = tiled ? kernel_for<Push>(kernels, vk::kernel::conv2d_forward_tiled, *t.output,
                                         with_epilogue_constants(tiled_constants(tiles, {kWeightBlock, fold ? 1 : 0}),
                                                                 t.epilogue))
                      : kernel_for<Push>(kernels, vk::kernel::conv2d_forward, *t.output,
                                         forward_constants(tiles, t.epilogue));
  recorder.dispatch(kernel,
                    {reads(*t.inputs[0]), vk::reads(blocked), vk::reads(has_bias_ ? t.tensors[1]->buffer() : blocked),
                     writes(*t.output), vk::reads(folded(t, &FoldedBatchNorm::weight)),
                     vk::reads(folded(t, &FoldedBatchNorm::bias)), vk::reads(folded(t, &FoldedBatchNorm::running_mean)),
                     vk::reads(folded(t, &FoldedBatchNorm::running_var)), epilogue_scale_arg(t.epilogue, *t.inputs[0]),
                     epilogue_residual_arg(t.epilogue, *t.inputs[0], *t.output)},
                    push(false, fold ? fold->eps : 0.0f), blocks(s.out_channels, tiles.rows_per_group()), groups_y,
                    groups_z);
}

void Conv2d::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Conv2dShape& s = shape_;
  const Tensor& dy = *t.output_grad;
  const vk::Buffer& weight = t.tensors[0]->buffer();
  if (t.epilogue.relu()) record_relu_backward_in_place(recorder, kernels, *t.output, *t.output_grad);

  if (t.input_grads[0]) {
    GemmTiles tiles = gemm_tiles(kernels.tile_target(), s.in_channels);
    bool accumulate = t.accumulate_input_grads[0];
    const Tensor& dx = *t.input_grads[0];
    // The tiled kernel takes each phase's taps (rows, columns) as constants.
    auto phase_taps = [&](int64_t phase, int64_t kernel_size) {
      return static_cast<int32_t>(phase < kernel_size ? (kernel_size - phase + s.stride - 1) / s.stride : 0);
    };
    auto kernel = [&](int64_t row, int64_t col) {
      if (tiles.kind != GemmKind::shared_memory)
        return kernel_for<Push>(kernels, vk::kernel::conv2d_backward_data, dx, constants(tiles));
      return kernel_for<Push>(kernels, vk::kernel::conv2d_backward_data_tiled, dx,
                              tiled_constants(tiles, {phase_taps(row, s.kernel_h), phase_taps(col, s.kernel_w)}));
    };
    // One dispatch per phase of the stride: the input pixels that only taps of that phase reach.
    // The count of a phase's rows (or columns): of size positions, those with (i + pad) % stride == phase.
    auto phase_count = [&](int64_t phase, int64_t size) {
      int64_t first = (phase - s.padding % s.stride + s.stride) % s.stride;
      return first < size ? (size - first + s.stride - 1) / s.stride : 0;
    };
    Push phase_push = push(accumulate);
    for (int64_t row = 0; row < s.stride; ++row)
      for (int64_t col = 0; col < s.stride; ++col) {
        int64_t columns = s.batch * phase_count(row, s.height) * phase_count(col, s.width);
        if (columns == 0) continue;
        phase_push.phase_row = static_cast<uint32_t>(row);
        phase_push.phase_col = static_cast<uint32_t>(col);
        auto [groups_y, groups_z] = column_groups(blocks(columns, tiles.columns_per_group()));
        recorder.dispatch(kernel(row, col), {reads(dy), vk::reads(weight), accumulate ? updates(dx) : writes(dx)},
                          phase_push, blocks(s.in_channels, tiles.rows_per_group()), groups_y, groups_z);
      }
  }

  GemmTiles tiles = gemm_tiles(kernels.tile_target(), s.out_channels);
  const vk::Buffer& dweight = t.grads[0]->buffer();
  int64_t columns = s.in_channels * s.kernel_h * s.kernel_w;
  auto [slices, slice_length] = weight_grad_slicing(kernels.tile_target(), tiles);
  const vk::Buffer& partial = slices > 1 ? t.tensors.back()->buffer() : dweight;
  bool tiled = tiles.kind == GemmKind::shared_memory;
  recorder.dispatch(tiled ? kernels.get<Push>(vk::kernel::conv2d_backward_weight_tiled, tiled_constants(tiles))
                          : kernel_for<Push>(kernels, vk::kernel::conv2d_backward_weight, *t.inputs[0], constants(tiles)),
                    {reads(dy), reads(*t.inputs[0]), slices > 1 ? vk::writes(partial) : vk::updates(partial)},
                    push(slices == 1, 0, slice_length), blocks(s.out_channels, tiles.rows_per_group()),
                    blocks(columns, tiles.columns_per_group()), static_cast<uint32_t>(slices));
  if (slices > 1) {
    struct ReducePush {
      uint32_t count, slices;
    };
    auto reduce = kernels.get<ReducePush>(vk::kernel::conv2d_backward_weight_reduce, {static_cast<int32_t>(kElementwiseGroup)});
    int64_t count = s.out_channels * columns;
    recorder.dispatch_elements(reduce, {vk::reads(partial), vk::updates(dweight)},
                               ReducePush{static_cast<uint32_t>(count), static_cast<uint32_t>(slices)}, count,
                               kElementwiseGroup);
  }
  if (has_bias_)
    record_bias_backward(recorder, kernels, dy, *t.grads[1], static_cast<uint32_t>(s.batch),
                         static_cast<uint32_t>(s.out_channels), static_cast<uint32_t>(s.out_height * s.out_width));
}

}  // namespace tessera
