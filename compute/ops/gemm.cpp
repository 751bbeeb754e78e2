#include "compute/ops/gemm.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "common/error.h"
#include "compute/op.h"
#include "compute/vk/context.h"

namespace tessera {

namespace {
struct GemmPush {
  uint32_t M, N, K;
  uint32_t a_m, a_k, b_k, b_n, c_m, c_n;
  uint32_t accumulate;
};
struct BiasPush {
  uint32_t batch, channels, pixels;
};
constexpr uint64_t kMaxGroupsY = 65535;
}  // namespace

namespace {
// The hook for VK_KHR_cooperative_matrix (fp16 x fp16 -> fp32) kernels: a device gets them
// where it offers the extension and such a kernel has been checked on a GPU. None has (no GPU
// was at hand to check one), so a device that offers it gets the shared-memory tiles; the kernel
// and its branch in the record functions come with the first GPU run.
constexpr bool kCooperativeMatrixKernelChecked = false;
bool uses_cooperative_matrix(const vk::TileTarget& target) {
  return target.cooperative_matrix && kCooperativeMatrixKernelChecked;
}

// The smallest power of two of rows per invocation, up to `most`, that covers M over `threads` rows.
int32_t rows_for(int64_t M, int64_t threads, int32_t most) {
  int64_t needed = (M + threads - 1) / threads;
  int32_t rows = 1;
  while (rows < most && rows < needed) rows *= 2;
  return rows;
}

GemmTiles register_tiles(const vk::TileTarget& target, int64_t M) {
  GemmTiles tiles{static_cast<int32_t>(target.subgroup_size), 8, 32, true, 8};
  tiles.share_columns = tiles.columns % tiles.group == 0;
  tiles.rows = rows_for(M, tiles.group, tiles.rows);
  // Four-element texels: 4 rows a lane and 8 columns (one a lane of an 8-lane subgroup) keep 32
  // accumulators, 16 reduction steps loaded ahead of their FMAs (1024^3 on lavapipe, against
  // 4 x 6 and 4 x 4, 4 to 16 steps: bench/README.md).
  tiles.quad_rows = 4;
  tiles.quad_columns = std::min(8, tiles.group);
  tiles.quad_steps = 16;
  return tiles;
}

GemmTiles shared_memory_tiles(const vk::TileTarget& target, int64_t M) {
  // 256 invocations (8 subgroups of 32, 4 of 64) where the device allows, and never less than
  // one subgroup; laid out as 16 x 16 (8 x 16, 8 x 8, ...) over the block's rows and columns.
  int32_t limit = static_cast<int32_t>(std::min(target.max_workgroup_invocations, target.max_workgroup_size_x));
  int32_t group = target.gemm_group ? target.gemm_group : 256;
  while (group > 1 && group > limit) group /= 2;
  group = std::max(group, std::min(static_cast<int32_t>(target.subgroup_size), limit));
  int32_t column_threads = 1;
  while (column_threads * column_threads < group) column_threads *= 2;
  int32_t row_threads = group / column_threads;
  // The largest tiles whose shared memory fits half the device's: 4x4 outputs per invocation,
  // 16 reduction steps deep; or what TESSERA_GEMM_TILES sets, within all of it. Not 8x8: on an
  // H200 (NVIDIA 580) a workgroup of 256 gets at most 128 registers an invocation, so 64
  // accumulators spilled to local memory (TESSERA_PIPELINE_STATISTICS) and the 4096^3 fp32
  // product ran at 2.2 TFLOP/s, against 26 with 4x4 (64 registers, no spill; 8 deep 25.8, 32
  // deep 10.9: bench/README.md).
  auto tiles_of = [&](int32_t outputs, int32_t depth) {
    GemmTiles tiles{group, rows_for(M, row_threads, outputs), outputs, false, 1, GemmKind::shared_memory};
    tiles.block_rows = row_threads * tiles.rows;
    tiles.block_columns = column_threads * outputs;
    tiles.depth = depth;
    return tiles;
  };
  if (target.gemm_outputs) {
    GemmTiles tiles = tiles_of(target.gemm_outputs, target.gemm_depth);
    if (tiles.shared_bytes() > target.max_shared_memory)
      throw UsageError("TESSERA_GEMM_TILES: " + std::to_string(tiles.shared_bytes()) +
                       " bytes of shared memory a workgroup, more than the device's " +
                       std::to_string(target.max_shared_memory));
    return tiles;
  }
  GemmTiles tiles{};
  for (auto [outputs, depth] : {std::pair{4, 16}, {4, 8}, {2, 8}, {1, 8}, {1, 4}}) {
    tiles = tiles_of(outputs, depth);
    if (tiles.shared_bytes() <= target.max_shared_memory / 2) break;
  }
  return tiles;
}
}  // namespace

uint32_t GemmTiles::shared_bytes() const {
  // shaders/gemm_tiled.glsl: each k row of a tile padded by one vec4.
  return static_cast<uint32_t>(sizeof(float) * depth * (block_rows + 4 + block_columns + 4));
}

std::vector<int32_t> GemmTiles::tiled_constants() const {
  return {group, rows, columns, block_rows, block_columns, depth};
}

GemmTiles gemm_tiles(const vk::TileTarget& target, int64_t M) {
  if (target.cpu_like()) return register_tiles(target, M);
  GemmTiles tiles = shared_memory_tiles(target, M);
  if (uses_cooperative_matrix(target)) tiles.kind = GemmKind::cooperative_matrix;
  return tiles;
}

std::pair<uint32_t, uint32_t> column_groups(uint64_t blocks) {
  if (blocks <= kMaxGroupsY) return {static_cast<uint32_t>(blocks), 1};
  uint64_t z = (blocks + kMaxGroupsY - 1) / kMaxGroupsY;
  return {static_cast<uint32_t>((blocks + z - 1) / z), static_cast<uint32_t>(z)};
}

namespace {
// Whether texels of four elements that cover a view of rows x columns lie within its tensor (a
// texel view holds whole texels only).
bool quads_within(const MatrixView& m, uint64_t rows, uint64_t columns) {
  uint64_t last = (rows - 1) * m.row_stride + (columns - 1) * m.col_stride;
  return (last | 3u) < m.elements();
}
}  // namespace

bool quad_texels_apply(const GemmTiles& tiles, uint32_t M, uint32_t N, uint32_t K, const MatrixView& a,
                       const MatrixView& b) {
  if (tiles.quad_rows == 0 || M == 0 || N == 0 || K % 4 != 0 || K == 0) return false;
  if (b.row_stride != 1 || b.col_stride % 4 != 0) return false;
  bool a_along_m = a.row_stride == 1 && a.col_stride % 4 == 0, a_along_k = a.col_stride == 1 && a.row_stride % 4 == 0;
  if (!a_along_m && !a_along_k) return false;
  uint64_t rows_per_group = static_cast<uint64_t>(tiles.quad_rows) * tiles.group;
  if ((N + tiles.quad_columns - 1) / tiles.quad_columns > kMaxGroupsY || (M + rows_per_group - 1) / rows_per_group > kMaxGroupsY)
    return false;
  return quads_within(a, M, K) && quads_within(b, K, N);
}

std::vector<int32_t> with_epilogue_constants(std::vector<int32_t> constants, const Epilogue& epilogue) {
  int32_t residual = epilogue.residual == nullptr ? 0 : epilogue.residual_first ? 1 : 2;
  constants.insert(constants.end(),
                   {static_cast<int32_t>(epilogue.activation), epilogue.scale != nullptr ? 1 : 0, residual});
  return constants;
}

vk::BufferArg epilogue_scale_arg(const Epilogue& epilogue, const Tensor& stand_in) {
  return vk::reads(epilogue.scale ? epilogue.scale->buffer() : stand_in.buffer());
}

vk::BufferArg epilogue_residual_arg(const Epilogue& epilogue, const Tensor& stand_in, const Tensor& output) {
  if (epilogue.residual && epilogue.residual->dtype() != output.dtype())
    throw std::logic_error("epilogue: a residual of another type than its output's (the kernel reads it as the output's)");
  return vk::reads(epilogue.residual ? epilogue.residual->buffer() : stand_in.buffer(), output.dtype() == DType::f16);
}

namespace {

// An operand's binding: its window of the tensor, or the whole tensor.
vk::BufferArg bound(const MatrixView& m, vk::BufferArg arg) {
  if (m.count == 0) return arg;
  const uint64_t size = element_size(m.tensor->dtype());
  return vk::window(arg, m.first * size, m.count * size);
}

// The bias binding, or where there is none a stand-in that the kernel leaves unread: A's own.
vk::BufferArg bias_arg(const Tensor* bias, const MatrixView& a) {
  return bias ? vk::reads(bias->buffer()) : bound(a, vk::reads(a.tensor->buffer()));
}

vk::BufferArg output_arg(const MatrixView& c, bool accumulate) {
  return bound(c, accumulate ? updates(*c.tensor) : writes(*c.tensor));
}

// record_gemm with texels of four elements (shaders/gemm_quads.comp) where quad_texels_apply;
// false where not (the caller records gemm.comp).
bool record_quad_gemm(vk::Recorder& recorder, vk::Kernels& kernels, const GemmTiles& tiles, const GemmPush& push,
                      MatrixView a, MatrixView b, MatrixView c, const Tensor* bias, const Epilogue& epilogue) {
  if (!quad_texels_apply(tiles, push.M, push.N, push.K, a, b)) return false;
  bool a_along_k = a.col_stride == 1;
  uint64_t column_blocks = (push.N + tiles.quad_columns - 1) / tiles.quad_columns;
  uint64_t rows_per_group = static_cast<uint64_t>(tiles.quad_rows) * tiles.group;
  uint64_t row_blocks = (push.M + rows_per_group - 1) / rows_per_group;
  auto kernel = kernel_for<GemmPush>(kernels, vk::kernel::gemm_quads, *c.tensor, *b.tensor,
                                     with_epilogue_constants({tiles.group, tiles.quad_rows, tiles.quad_columns,
                                                              bias ? 1 : 0, a_along_k ? 1 : 0, tiles.quad_steps},
                                                             epilogue));
  // Workgroups x count column blocks, y row blocks (gemm.comp's COLUMNS_FIRST: neighbouring
  // workgroups share A's rows).
  recorder.dispatch(kernel,
                    {bound(a, reads_quads(*a.tensor)), bound(b, reads_quads(*b.tensor)), bias_arg(bias, a),
                     output_arg(c, push.accumulate), epilogue_scale_arg(epilogue, *b.tensor),
                     epilogue_residual_arg(epilogue, *b.tensor, *c.tensor)},
                    push, static_cast<uint32_t>(column_blocks), static_cast<uint32_t>(row_blocks), 1);
  return true;
}

// record_gemm with shared-memory tiles: consecutive invocations load along each operand's
// contiguous index, so no operand needs the register variant's transposition.
void record_tiled_gemm(vk::Recorder& recorder, vk::Kernels& kernels, const GemmTiles& tiles, const GemmPush& push,
                       MatrixView a, MatrixView b, MatrixView c, const Tensor* bias, const Epilogue& epilogue) {
  std::vector<int32_t> constants = tiles.tiled_constants();
  constants.insert(constants.end(), {a.col_stride == 1 ? 1 : 0, b.col_stride == 1 ? 1 : 0, bias ? 1 : 0});
  auto [groups_y, groups_z] = column_groups((push.N + tiles.block_columns - 1) / tiles.block_columns);
  recorder.dispatch(kernel_for<GemmPush>(kernels, vk::kernel::gemm_tiled, *c.tensor,
                                         with_epilogue_constants(std::move(constants), epilogue)),
                    {bound(a, reads(*a.tensor)), bound(b, reads(*b.tensor)), bias_arg(bias, a),
                     output_arg(c, push.accumulate), epilogue_scale_arg(epilogue, *b.tensor),
                     epilogue_residual_arg(epilogue, *b.tensor, *c.tensor)},
                    push, (push.M + tiles.block_rows - 1) / tiles.block_rows, groups_y, groups_z);
}
}  // namespace

void record_gemm(vk::Recorder& recorder, vk::Kernels& kernels, uint32_t M, uint32_t N, uint32_t K,
                 MatrixView a, MatrixView b, MatrixView c, bool accumulate, const Tensor* bias,
                 const Epilogue& epilogue) {
  if (epilogue.batch_norm != nullptr || (accumulate && (epilogue.activation != Epilogue::Activation::none ||
                                                        epilogue.scale != nullptr || epilogue.residual != nullptr)))
    throw std::logic_error("record_gemm: a batch norm is conv2d's to fold, and an epilogue does not accumulate");
  if (c.count != 0 && epilogue.residual != nullptr)
    throw std::logic_error("record_gemm: a residual is laid out as the whole output, not a window of it");
  if (GemmTiles tiles = gemm_tiles(kernels.tile_target(), M); tiles.kind == GemmKind::shared_memory)
    return record_tiled_gemm(recorder, kernels, tiles, {M, N, K, a.row_stride, a.col_stride, b.row_stride,
                                                        b.col_stride, c.row_stride, c.col_stride, accumulate ? 1u : 0u},
                             a, b, c, bias, epilogue);
  // The invocations of a workgroup take neighbouring rows of C, so they read A down a column.
  // Where A's rows are strided and B's columns contiguous, C^T = B^T A^T reads both along
  // contiguous memory: rows a power-of-two apart all fall in one cache set (a row-major 1024^3
  // product: 23 -> 50 GFLOPS on lavapipe).
  // Not where a row has its own bias or scale: rows would become columns.
  if (bias == nullptr && epilogue.scale == nullptr && a.row_stride != 1 && b.col_stride == 1) {
    std::swap(M, N);
    std::swap(a, b);
    std::swap(a.row_stride, a.col_stride);
    std::swap(b.row_stride, b.col_stride);
    std::swap(c.row_stride, c.col_stride);
  }
  GemmTiles tiles = gemm_tiles(kernels.tile_target(), M);
  if (record_quad_gemm(recorder, kernels, tiles,
                       {M, N, K, a.row_stride, a.col_stride, b.row_stride, b.col_stride, c.row_stride, c.col_stride,
                        accumulate ? 1u : 0u},
                       a, b, c, bias, epilogue))
    return;
  // The workgroup's shared B is loaded along whichever of its dimensions is contiguous.
  bool share_rows = tiles.share_columns && b.col_stride != 1 && b.row_stride == 1 &&
                    tiles.reduction_unroll == tiles.group;
  uint32_t rows_per_group = static_cast<uint32_t>(tiles.group * tiles.rows);
  uint32_t row_blocks = (M + rows_per_group - 1) / rows_per_group;
  uint64_t column_blocks = (N + tiles.columns - 1) / tiles.columns;
  // Workgroups sweep the columns of one row block before the next (gemm.comp's COLUMNS_FIRST):
  // neighbouring workgroups share A's rows, a weight's panel that stays in cache, where rows
  // first streams all of A once per column block. ViT-L's linear layers with W^T, 788 tokens:
  // 25 -> 37-47 GFLOPS on lavapipe (bench/README.md; W as stored: 25 either way).
  bool columns_first = column_blocks <= kMaxGroupsY;
  auto kernel = kernel_for<GemmPush>(
      kernels, vk::kernel::gemm, *c.tensor, *b.tensor,
      with_epilogue_constants({tiles.group, tiles.rows, tiles.columns, bias ? 1 : 0,
                               tiles.share_columns && !share_rows ? 1 : 0, tiles.reduction_unroll, share_rows ? 1 : 0,
                               columns_first ? 1 : 0},
                              epilogue));
  GemmPush push{M, N, K, a.row_stride, a.col_stride, b.row_stride, b.col_stride, c.row_stride, c.col_stride,
                accumulate ? 1u : 0u};
  auto [groups_y, groups_z] = column_groups(column_blocks);
  uint32_t groups_x = row_blocks;
  if (columns_first) std::tie(groups_x, groups_y, groups_z) = std::tuple{static_cast<uint32_t>(column_blocks), row_blocks, 1u};
  recorder.dispatch(kernel,
                    // Without a bias its binding is unread: any float buffer stands in.
                    {bound(a, reads(*a.tensor)), bound(b, reads(*b.tensor)), bias_arg(bias, a),
                     output_arg(c, accumulate), epilogue_scale_arg(epilogue, *b.tensor),
                     epilogue_residual_arg(epilogue, *b.tensor, *c.tensor)},
                    push, groups_x, groups_y, groups_z);
}

void record_blocked_weight(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& weight, const Tensor& blocked,
                           uint32_t rows, uint32_t columns, int32_t block, const FoldedBatchNorm* fold) {
  struct WeightPush {
    uint32_t rows, columns, count;
    float eps;
  };
  // Without a folded batch norm its bindings take the weight, which the kernel leaves unread.
  const vk::Buffer& gamma = fold ? fold->weight->buffer() : weight.buffer();
  const vk::Buffer& variance = fold ? fold->running_var->buffer() : weight.buffer();
  WeightPush push{rows, columns, static_cast<uint32_t>(blocked.count()), fold ? fold->eps : 0.0f};
  // The weight read through its own type (fp16 weights: Network::set_weight_dtype), the copy
  // written in the blocked tensor's.
  recorder.dispatch_elements(
      kernel_for<WeightPush>(kernels, vk::kernel::conv2d_forward_weight, blocked,
                             {static_cast<int32_t>(kElementwiseGroup), block, fold ? 1 : 0}),
      {reads(weight), writes(blocked), vk::reads(gamma), vk::reads(variance)}, push, push.count, kElementwiseGroup);
}

void record_bias_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& dy,
                          const Tensor& dbias, uint32_t batch, uint32_t channels, uint32_t pixels) {
  recorder.dispatch(kernel_for<BiasPush>(kernels,
                                         reduction_kernel(kernels, vk::kernel::bias_backward, vk::kernel::bias_backward_subgroup),
                                         dy),
                    {reads(dy), updates(dbias)},
                    BiasPush{batch, channels, pixels}, channels);
}

}  // namespace tessera
