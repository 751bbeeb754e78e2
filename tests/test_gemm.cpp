// record_gemm against a plain CPU product for every operand layout: row-major or transposed A
// and B (which choose between C and C^T = B^T A^T, and between sharing B along its columns or
// along the reduction), odd sizes, reductions shorter than and not a multiple of the unroll,
// and accumulation into C.
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

TEST(Gemm, EveryLayoutMatchesCpu) {
  vk::Context& context = test::context();
  for (const Case& c : {Case{37, 45, 29}, Case{1, 70, 8}, Case{64, 33, 3}, Case{100, 1, 50}, Case{40, 64, 130}})
    for (int layout = 0; layout < 8; ++layout) {
      bool a_t = layout & 1, b_t = layout & 2, c_t = layout & 4;
      SCOPED_TRACE(std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " A" +
                   (a_t ? "^T" : "") + " B" + (b_t ? "^T" : "") + " C" + (c_t ? "^T" : ""));
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

}  // namespace
}  // namespace tessera
