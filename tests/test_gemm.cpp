// record_gemm against a plain CPU product for every operand layout: row-major or transposed A
// and B (which choose between C and C^T = B^T A^T, and between sharing B along its columns or
// along the reduction), odd sizes, reductions shorter than and not a multiple of the unroll,
// and accumulation into C; with the tile shapes of both branches of the choice (a CPU's and a
// GPU's, whichever device runs the test), at sizes that are not multiples of either's tiles.
#include <gtest/gtest.h>

#include <string>

#include "compute/ops/gemm.h"
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

// The choice itself: what each branch picks, and fewer rows per invocation for a small M.
TEST(Gemm, TilesFollowTheTarget) {
  auto expect = [](const GemmTiles& tiles, GemmTiles want) {
    EXPECT_EQ(tiles.group, want.group);
    EXPECT_EQ(tiles.rows, want.rows);
    EXPECT_EQ(tiles.columns, want.columns);
    EXPECT_EQ(tiles.share_columns, want.share_columns);
    EXPECT_EQ(tiles.reduction_unroll, want.reduction_unroll);
  };
  expect(gemm_tiles({"cpu", 8}, 1000), {8, 8, 32, true, 8});
  expect(gemm_tiles({"cpu", 8}, 20), {8, 4, 32, true, 8});  // 3 rows needed, rounded up to 4
  expect(gemm_tiles({"cpu", 64}, 1000), {64, 8, 32, false, 8});  // 32 columns do not split over 64
  for (const char* gpu : {"discrete-gpu", "integrated-gpu", "virtual-gpu", "other"}) {
    expect(gemm_tiles({gpu, 32}, 1000), {64, 4, 8, false, 1});
    expect(gemm_tiles({gpu, 32}, 3), {64, 1, 8, false, 1});
  }
}

// Every layout and size against the CPU product, with the tiles of `target`.
void expect_every_layout_matches(vk::Context& context, const vk::TileTarget& target) {
  test::TileTargetScope scope(context, target);
  for (const Case& c : {Case{37, 45, 29}, Case{1, 70, 8}, Case{64, 33, 3}, Case{100, 1, 50}, Case{40, 64, 130},
                        Case{300, 37, 19}, Case{257, 9, 33}})
    for (int layout = 0; layout < 8; ++layout) {
      bool a_t = layout & 1, b_t = layout & 2, c_t = layout & 4;
      SCOPED_TRACE(target.device_type + " tiles, " + std::to_string(c.M) + "x" + std::to_string(c.N) + "x" +
                   std::to_string(c.K) + " A" + (a_t ? "^T" : "") + " B" + (b_t ? "^T" : "") + " C" +
                   (c_t ? "^T" : ""));
      auto a = test::random_values(size_t{c.M} * c.K, 1), b = test::random_values(size_t{c.K} * c.N, 2),
           c0 = test::random_values(size_t{c.M} * c.N, 3);
      Tensor ta(context, "a", {c.M, c.K}), tb(context, "b", {c.K, c.N}), tc(context, "c", {c.M, c.N});
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
        test::expect_near(tc.download(), expected, 1e-4, accumulate ? "c += a b" : "c = a b");
      }
    }
}

// Both branches of the tile choice run here: the device's own and the other (a GPU's shapes on
// lavapipe), at sizes that are not multiples of either's tiles (300 and 257 rows: past a GPU
// workgroup's 256, 9 and 37 columns: not multiples of 8 or 32).
TEST(Gemm, EveryLayoutMatchesCpu) {
  vk::Context& context = test::context();
  for (const vk::TileTarget& target : test::runnable_tile_targets(context)) expect_every_layout_matches(context, target);
}

}  // namespace
}  // namespace tessera
