#include "compute/ops/gemm.h"

#include <utility>

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

GemmTiles gemm_tiles(const vk::TileTarget& target, int64_t M) {
  GemmTiles tiles = target.device_type == "cpu" ? GemmTiles{static_cast<int32_t>(target.subgroup_size), 8, 32, true, 8}
                                                : GemmTiles{64, 4, 8, false, 1};
  tiles.share_columns = tiles.share_columns && tiles.columns % tiles.group == 0;
  int64_t rows_needed = (M + tiles.group - 1) / tiles.group;
  int32_t rows = 1;
  while (rows < tiles.rows && rows < rows_needed) rows *= 2;
  tiles.rows = rows;
  return tiles;
}

std::pair<uint32_t, uint32_t> column_groups(uint64_t blocks) {
  if (blocks <= kMaxGroupsY) return {static_cast<uint32_t>(blocks), 1};
  uint64_t z = (blocks + kMaxGroupsY - 1) / kMaxGroupsY;
  return {static_cast<uint32_t>((blocks + z - 1) / z), static_cast<uint32_t>(z)};
}

void record_gemm(vk::Recorder& recorder, vk::Kernels& kernels, uint32_t M, uint32_t N, uint32_t K,
                 MatrixView a, MatrixView b, MatrixView c, bool accumulate, const Tensor* bias, bool relu) {
  // The invocations of a workgroup take neighbouring rows of C, so they read A down a column.
  // Where A's rows are strided and B's columns contiguous, C^T = B^T A^T reads both along
  // contiguous memory: rows a power-of-two apart all fall in one cache set (a row-major 1024^3
  // product: 23 -> 50 GFLOPS on lavapipe).
  if (bias == nullptr && a.row_stride != 1 && b.col_stride == 1) {
    std::swap(M, N);
    std::swap(a, b);
    std::swap(a.row_stride, a.col_stride);
    std::swap(b.row_stride, b.col_stride);
    std::swap(c.row_stride, c.col_stride);
  }
  GemmTiles tiles = gemm_tiles(kernels.tile_target(), M);
  // The workgroup's shared B is loaded along whichever of its dimensions is contiguous.
  bool share_rows = tiles.share_columns && b.col_stride != 1 && b.row_stride == 1 &&
                    tiles.reduction_unroll == tiles.group;
  auto kernel = kernel_for<GemmPush>(kernels, vk::kernel::gemm, *c.tensor, {tiles.group, tiles.rows, tiles.columns, bias ? 1 : 0,
                                      tiles.share_columns && !share_rows ? 1 : 0, tiles.reduction_unroll,
                                      share_rows ? 1 : 0, relu ? 1 : 0});
  GemmPush push{M, N, K, a.row_stride, a.col_stride, b.row_stride, b.col_stride, c.row_stride, c.col_stride,
                accumulate ? 1u : 0u};
  uint32_t rows_per_group = static_cast<uint32_t>(tiles.group * tiles.rows);
  auto [groups_y, groups_z] = column_groups((N + tiles.columns - 1) / tiles.columns);
  recorder.dispatch(kernel,
                    // Without a bias its binding is unread: any float buffer stands in.
                    {reads(*a.tensor), reads(*b.tensor), vk::reads(bias ? bias->buffer() : a.tensor->buffer()),
                     accumulate ? updates(*c.tensor) : writes(*c.tensor)},
                    push, (M + rows_per_group - 1) / rows_per_group, groups_y, groups_z);
}

void record_bias_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& dy,
                          const Tensor& dbias, uint32_t batch, uint32_t channels, uint32_t pixels) {
  recorder.dispatch(kernel_for<BiasPush>(kernels, vk::kernel::bias_backward, dy), {reads(dy), updates(dbias)},
                    BiasPush{batch, channels, pixels}, channels);
}

}  // namespace tessera
