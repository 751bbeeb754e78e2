// record_gemm against a plain CPU product for every operand layout: row-major or transposed A
// and B (which choose between C and C^T = B^T A^T, and between sharing B along its columns or
// along the reduction), odd sizes, reductions shorter than and not a multiple of the unroll,
// and accumulation into C, and reductions thousands of steps long; with every kernel variant
// that runs on the device (a CPU's register blocks, GPUs' shared-memory tiles), at sizes that
// are not multiples of their tiles, in fp32 and fp16; and the choice of variant and tiles from
// the properties of the devices tessera is made for.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <vector>
#include <string>

#include "common/error.h"
#include "compute/ops/gemm.h"
#include "compute/vk/context.h"
#include "compute/tensor.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  uint32_t M, N, K;
};

// Element (r, c) of a rows x columns matrix stored row-major, or column-major if transposed.
MatrixView view(const Tensor& t, uint32_t rows, uint32_t columns, bool transposed) {
  return transposed ? MatrixView{&t, 1, rows} : MatrixView{&t, columns, 1};
}

void expect_tiles(const GemmTiles& tiles, GemmTiles want) {
  EXPECT_EQ(tiles.kind, want.kind);
  EXPECT_EQ(tiles.group, want.group);
  EXPECT_EQ(tiles.rows, want.rows);
  EXPECT_EQ(tiles.columns, want.columns);
  EXPECT_EQ(tiles.share_columns, want.share_columns);
  EXPECT_EQ(tiles.reduction_unroll, want.reduction_unroll);
  EXPECT_EQ(tiles.block_rows, want.block_rows);
  EXPECT_EQ(tiles.block_columns, want.block_columns);
  EXPECT_EQ(tiles.depth, want.depth);
}

// Shared-memory tiles: `group` invocations, rows x columns outputs each, a block of
// block_rows x block_columns, `depth` reduction steps deep.
GemmTiles shared(int32_t group, int32_t rows, int32_t columns, int32_t block_rows, int32_t block_columns,
                 int32_t depth) {
  return {group, rows, columns, false, 1, GemmKind::shared_memory, block_rows, block_columns, depth};
}

// The choice on a CPU device (lavapipe): register blocks, and fewer rows for a small M.
TEST(Gemm, CpuDevicesGetRegisterBlocks) {
  expect_tiles(gemm_tiles({"cpu", 8}, 1000), {8, 8, 32, true, 8});
  expect_tiles(gemm_tiles({"cpu", 8}, 20), {8, 4, 32, true, 8});      // 3 rows needed, rounded up to 4
  expect_tiles(gemm_tiles({"cpu", 64}, 1000), {64, 8, 32, false, 8});  // 32 columns do not split over 64
  // Four-element texels: 4 rows a lane, a column a lane up to 8, 16 steps loaded ahead.
  GemmTiles eight = gemm_tiles({"cpu", 8}, 1000), four = gemm_tiles({"cpu", 4}, 1000);
  EXPECT_EQ(std::vector<int32_t>({eight.quad_rows, eight.quad_columns, eight.quad_steps}), std::vector<int32_t>({4, 8, 16}));
  EXPECT_EQ(std::vector<int32_t>({four.quad_rows, four.quad_columns, four.quad_steps}), std::vector<int32_t>({4, 4, 16}));
  EXPECT_EQ(gemm_tiles(test::reference_devices()[0].target, 1000).quad_rows, 0);  // a GPU: none
}

// Which operands the four-element texels take: B along k, A along m or k, strides and K in
// multiples of 4, whole texels within each tensor.
TEST(Gemm, QuadTexelsNeedAlignedOperands) {
  vk::Context& context = test::context();
  GemmTiles tiles = gemm_tiles({"cpu", 8}, 1000);
  Tensor a(context, "a", {36, 52}), b(context, "b", {52, 44});
  EXPECT_TRUE(quad_texels_apply(tiles, 36, 44, 52, {&a, 1, 36}, {&b, 1, 52}));   // A along m
  EXPECT_TRUE(quad_texels_apply(tiles, 36, 44, 52, {&a, 52, 1}, {&b, 1, 52}));   // A along k
  EXPECT_FALSE(quad_texels_apply(tiles, 36, 44, 52, {&a, 52, 1}, {&b, 44, 1}));  // B along n
  EXPECT_FALSE(quad_texels_apply(tiles, 36, 44, 50, {&a, 50, 1}, {&b, 1, 50}));  // K not a multiple of 4
  EXPECT_FALSE(quad_texels_apply(tiles, 35, 44, 52, {&a, 1, 35}, {&b, 1, 52}));  // A's stride not one
  EXPECT_FALSE(quad_texels_apply(tiles, 36, 44, 56, {&a, 1, 36}, {&b, 1, 56}));  // past the tensors
  GemmTiles gpu = gemm_tiles(test::reference_devices()[0].target, 1000);
  EXPECT_FALSE(quad_texels_apply(gpu, 36, 44, 52, {&a, 1, 36}, {&b, 1, 52}));
}

// The choice on GPUs, from each reference device's properties (never its name).
TEST(Gemm, GpuTilesFollowTheDevicesProperties) {
  std::map<std::string, GemmTiles> want = {
      // 256 invocations of 4x4 outputs: 64x64 blocks, 16 deep (8.5 KB, within half of 48 KB)
      {"NVIDIA H100 (NVIDIA driver)", shared(256, 4, 4, 64, 64, 16)},
      {"AMD RDNA3, wave64 (RADV)", shared(256, 4, 4, 64, 64, 16)},  // 4 subgroups of 64
      {"AMD RDNA2, wave32", shared(256, 4, 4, 64, 64, 16)},
      {"Intel Xe (ANV)", shared(256, 4, 4, 64, 64, 16)},
      {"Apple M1 (MoltenVK)", shared(256, 4, 4, 64, 64, 16)},  // within half of its 32 KB
      {"lavapipe", {8, 8, 32, true, 8}},
      // subgroups of 8: SIMD lanes of a CPU, whatever type the device is presented as
      {"lavapipe presented as a discrete GPU", {8, 8, 32, true, 8}},
      // 128 invocations as 8 x 16, 16 KB of shared memory
      {"Vulkan's minimum limits, subgroups of 32", shared(128, 4, 4, 32, 64, 16)},
  };
  for (const test::ReferenceDevice& device : test::reference_devices()) {
    SCOPED_TRACE(device.name);
    ASSERT_TRUE(want.count(device.name));
    GemmTiles tiles = gemm_tiles(device.target, 4096);
    expect_tiles(tiles, want[device.name]);
    if (tiles.kind != GemmKind::shared_memory) continue;
    // What every GPU variant keeps to: within the device's limits, a whole number of subgroups,
    // its invocations covering the block, its tiles in half the shared memory.
    EXPECT_LE(static_cast<uint32_t>(tiles.group), device.target.max_workgroup_invocations);
    EXPECT_EQ(tiles.group % static_cast<int32_t>(device.target.subgroup_size), 0);
    EXPECT_EQ((tiles.block_rows / tiles.rows) * (tiles.block_columns / tiles.columns), tiles.group);
    EXPECT_LE(tiles.shared_bytes(), device.target.max_shared_memory / 2);
    // A small M: fewer rows per invocation (3 rows over the row threads: one each).
    GemmTiles narrow = gemm_tiles(device.target, 3);
    EXPECT_EQ(narrow.rows, 1);
    EXPECT_EQ(narrow.block_rows, tiles.block_rows / tiles.rows);
    EXPECT_EQ(narrow.block_columns, tiles.block_columns);
  }
}

// Where the workgroup limits are below 256 invocations, and on a device with no more than
// Vulkan's 16 KB: smaller blocks.
TEST(Gemm, GpuTilesKeepWithinTheLimits) {
  vk::TileTarget small{"discrete-gpu", 32, 32768, 64, 1024};
  expect_tiles(gemm_tiles(small, 4096), shared(64, 4, 4, 32, 32, 16));
  vk::TileTarget vulkan_minimum{"discrete-gpu", 32, 16384, 256, 1024};  // 64x64x16 takes 8704 B, past half
  expect_tiles(gemm_tiles(vulkan_minimum, 4096), shared(256, 4, 4, 64, 64, 8));
  vk::TileTarget narrow_x{"discrete-gpu", 32, 49152, 1024, 128};
  expect_tiles(gemm_tiles(narrow_x, 4096), shared(128, 4, 4, 32, 64, 16));
}

// TESSERA_GEMM_TILES (a tile sweep on a new GPU) sets a GPU's tiles, within its shared memory,
// and is refused by name where malformed.
TEST(Gemm, TileSweepVariableSetsTheGpuTiles) {
  vk::TileTarget h100 = test::reference_devices()[0].target;
  ::setenv("TESSERA_GEMM_TILES", "4,32,128", 1);
  vk::TileTarget swept = vk::tile_target_of(test::context().info());
  h100.gemm_outputs = swept.gemm_outputs;
  h100.gemm_depth = swept.gemm_depth;
  h100.gemm_group = swept.gemm_group;
  // 128 invocations as 8 x 16, 4 x 4 outputs each, 32 deep
  expect_tiles(gemm_tiles(h100, 4096), shared(128, 4, 4, 32, 64, 32));
  h100.gemm_outputs = 8;  // 128 x 128 x 32 takes 33.8 KB: allowed, within the device's 48
  h100.gemm_group = 256;
  expect_tiles(gemm_tiles(h100, 4096), shared(256, 8, 8, 128, 128, 32));
  h100.max_shared_memory = 32768;
  EXPECT_THROW(gemm_tiles(h100, 4096), UsageError);
  for (const char* malformed : {"3,16", "8", "8,16,256,1", "8,64", "8,16,16", "a,16", "8,,16"}) {
    ::setenv("TESSERA_GEMM_TILES", malformed, 1);
    EXPECT_THROW(vk::tile_target_of(test::context().info()), UsageError) << malformed;
  }
  ::unsetenv("TESSERA_GEMM_TILES");
  EXPECT_EQ(vk::tile_target_of(test::context().info()).gemm_outputs, 0);
}

// VK_KHR_cooperative_matrix: a device that offers it gets the shared-memory tiles until a
// cooperative-matrix kernel has been checked on a GPU (the hook in gemm.cpp).
TEST(Gemm, CooperativeMatrixWaitsForACheckedKernel) {
  vk::TileTarget h100 = test::reference_devices()[0].target;
  ASSERT_TRUE(h100.cooperative_matrix);
  EXPECT_EQ(gemm_tiles(h100, 4096).kind, GemmKind::shared_memory);
}

// Each case in each of `layouts` (bit 0: A transposed, 1: B transposed, 2: C transposed)
// against the CPU product, with the tiles of `target`, in fp32 or with fp16 operands and output
// (float sums: the output's rounding, 2^-11 relative, dominates); values drawn from [low, high).
void expect_products_match(vk::Context& context, const vk::TileTarget& target, DType dtype,
                           std::initializer_list<Case> cases, std::initializer_list<int> layouts, float low = -1,
                           float high = 1) {
  test::TileTargetScope scope(context, target);
  double tolerance = dtype == DType::f16 ? 1.0 / 1024 : 1e-4;
  for (const Case& c : cases)
    for (int layout : layouts) {
      bool a_t = layout & 1, b_t = layout & 2, c_t = layout & 4;
      SCOPED_TRACE(test::describe(target) + (dtype == DType::f16 ? ", fp16, " : ", fp32, ") + std::to_string(c.M) +
                   "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " A" + (a_t ? "^T" : "") + " B" +
                   (b_t ? "^T" : "") + " C" + (c_t ? "^T" : ""));
      auto values = [&](size_t count, uint32_t seed) {
        auto v = test::random_values(count, seed, low, high);
        return dtype == DType::f16 ? from_half(to_half(v)) : v;
      };
      auto a = values(size_t{c.M} * c.K, 1), b = values(size_t{c.K} * c.N, 2), c0 = values(size_t{c.M} * c.N, 3);
      Tensor ta(context, "a", {c.M, c.K}, dtype), tb(context, "b", {c.K, c.N}, dtype), tc(context, "c", {c.M, c.N}, dtype);
      ta.upload(a);
      tb.upload(b);
      MatrixView va = view(ta, c.M, c.K, a_t), vb = view(tb, c.K, c.N, b_t), vc = view(tc, c.M, c.N, c_t);
      auto at = [](const std::vector<float>& v, MatrixView m, uint32_t r, uint32_t col) {
        return static_cast<double>(v[size_t{r} * m.row_stride + size_t{col} * m.col_stride]);
      };
      for (bool accumulate : {false, true}) {
        tc.upload(c0);
        vk::Program program(context);
        {
          vk::Recorder recorder(context, program);
          record_gemm(recorder, context.kernels(), c.M, c.N, c.K, va, vb, vc, accumulate);
          recorder.finish();
        }
        program.run();
        std::vector<float> expected(c0.size());
        for (uint32_t m = 0; m < c.M; ++m)
          for (uint32_t n = 0; n < c.N; ++n) {
            double sum = accumulate ? at(c0, vc, m, n) : 0.0;
            for (uint32_t k = 0; k < c.K; ++k) sum += at(a, va, m, k) * at(b, vb, k, n);
            expected[size_t{m} * vc.row_stride + size_t{n} * vc.col_stride] = static_cast<float>(sum);
          }
        test::expect_near(tc.download(), expected, tolerance, accumulate ? "c += a b" : "c = a b");
      }
    }
}

// Every variant that runs here (the device's own, a CPU's register blocks, the reference GPUs'
// shared-memory tiles that fit), at sizes that are not multiples of any of their tiles (300 and
// 257 rows: past a 256-row block, 131 x 133: past 128, 9 and 37 columns: not multiples of 8 or
// 32): every layout in fp32; in fp16 (the same addressing) the layouts with all operands plain
// and all transposed, which set both loading directions of each operand.
TEST(Gemm, EveryLayoutMatchesCpu) {
  vk::Context& context = test::context();
  for (const vk::TileTarget& target : test::runnable_tile_targets(context))
    for (DType dtype : {DType::f32, DType::f16})
      expect_products_match(context, target, dtype,
                            {Case{37, 45, 29}, Case{1, 70, 8}, Case{64, 33, 3}, Case{100, 1, 50}, Case{40, 64, 130},
                             Case{300, 37, 19}, Case{257, 9, 33}, Case{131, 133, 35}},
                            dtype == DType::f32 ? std::initializer_list<int>{0, 1, 2, 3, 4, 5, 6, 7}
                                                : std::initializer_list<int>{0, 7});
}

// The four-element texels' kernel (a CPU's, where quad_texels_apply): sizes that are not
// multiples of its 32 x 8 block, reductions of whole and partial 16-step blocks (52: 3 and 4
// steps; 4: one partial block), A along m (tt, and nn as C^T = B^T A^T where N is a multiple of
// 4) and along k (nt, any M), in fp32 and fp16. With a CPU's register tiles (the device's own on
// lavapipe; GPU tiles have no such kernel).
TEST(Gemm, QuadTexelLayoutsMatchCpu) {
  vk::Context& context = test::context();
  for (const vk::TileTarget& target : test::runnable_tile_targets(context)) {
    if (gemm_tiles(target, 1000).quad_rows == 0) continue;
    for (DType dtype : {DType::f32, DType::f16})
      expect_products_match(context, target, dtype, {Case{36, 44, 52}, Case{37, 45, 28}, Case{100, 12, 4}},
                            dtype == DType::f32 ? std::initializer_list<int>{0, 2, 3, 6}
                                                : std::initializer_list<int>{2, 3});
  }
}

// Reductions of thousands of steps (hundreds of shared-memory slices, each between barriers):
// lavapipe has been seen to return zeros from kernels that loop this long around barrier().
// Positive values, so that no sum cancels and a lost slice shows.
TEST(Gemm, LongReductionsMatchCpu) {
  vk::Context& context = test::context();
  for (const vk::TileTarget& target : test::runnable_tile_targets(context))
    for (DType dtype : {DType::f32, DType::f16})
      expect_products_match(context, target, dtype, {Case{70, 45, 6001}}, {0, 7}, 0.5f, 1.0f);
}

}  // namespace
}  // namespace tessera
