// attention_pool against the CPU and central differences, with padding rows past the count, for
// one score column (ABMIL) and several (DSMIL's pool a class), fp32 and fp16.
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/attention_pool.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t rows, width, count, columns = 1;
};

TEST(AttentionPool, ForwardMatchesCpuAndIgnoresPadding) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {Case{7, 5, 7}, Case{40, 33, 23}, Case{1, 1, 1}, Case{300, 3, 299}, Case{7, 5, 7, 3},
                          Case{40, 33, 23, 2}, Case{1, 4, 1, 2}, Case{10001, 6, 10001, 2}}) {
      SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.width) + " count " + std::to_string(c.count) +
                   " columns " + std::to_string(c.columns) + (activations == DType::f16 ? " fp16" : " fp32"));
      AttentionPool pool;
      test::OpCheck check(test::context(), pool, {{c.rows, c.columns}, {c.rows, c.width}, {1}}, 3,
                          {DType::f32, DType::f32, DType::u32}, {}, activations);
      for (auto& s : check.inputs[0]) s *= 4;  // a peaked softmax (whole powers of two keep fp16 values exact)
      check.inputs[2] = {static_cast<float>(c.count)};
      const auto& scores = check.inputs[0];
      std::vector<float> expected(static_cast<size_t>(c.columns * c.width));
      for (int64_t k = 0; k < c.columns; ++k) {
        double largest = scores[k], total = 0;
        for (int64_t n = 0; n < c.count; ++n) largest = std::max<double>(largest, scores[n * c.columns + k]);
        for (int64_t n = 0; n < c.count; ++n) total += std::exp(scores[n * c.columns + k] - largest);
        for (int64_t d = 0; d < c.width; ++d) {
          double sum = 0;
          for (int64_t n = 0; n < c.count; ++n)
            sum += std::exp(scores[n * c.columns + k] - largest) / total * check.inputs[1][n * c.width + d];
          expected[k * c.width + d] = static_cast<float>(sum);
        }
      }
      test::expect_near(check.forward(), expected, test::forward_tolerance(activations), "z");
    }
}

TEST(AttentionPool, BackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{6, 4, 4}, Case{5, 7, 5}, Case{9, 3, 1}, Case{6, 4, 4, 3}, Case{5, 3, 5, 2}}) {
    AttentionPool pool;
    test::OpCheck check(test::context(), pool, {{c.rows, c.columns}, {c.rows, c.width}, {1}}, 4,
                        {DType::f32, DType::f32, DType::u32});
    check.inputs[2] = {static_cast<float>(c.count)};
    check.expect_gradients_match();
  }
}

// Features past what one binding reaches (4 KiB here) are read a window of rows at a time, in
// forward and in the scores' gradient: fp32's windows of 192 rows, fp16's of 384, the last ones
// past the count.
TEST(AttentionPool, WindowsOfRowsMatchTheWholeBag) {
  for (DType activations : {DType::f32, DType::f16}) {
    SCOPED_TRACE(activations == DType::f16 ? "fp16" : "fp32");
    AttentionPool pool;
    test::OpCheck check(test::context(), pool, {{600, 2}, {600, 5}, {1}}, 3, {DType::f32, DType::f32, DType::u32}, {},
                        activations);
    check.inputs[2] = {450.0f};
    const std::vector<float> dz = test::random_values(10, 4);
    const std::vector<float> whole = check.forward();
    const auto whole_grads = check.backward(dz);
    test::TileTargetScope scope(test::context(), test::binding_at_most(test::context(), 4096));
    test::expect_near(check.forward(), whole, test::forward_tolerance(activations), "z");
    const auto grads = check.backward(dz);
    ASSERT_EQ(grads.size(), whole_grads.size());
    for (size_t i = 0; i < grads.size(); ++i) test::expect_near(grads[i], whole_grads[i], 1e-5, "gradient");
  }
}

TEST(AttentionPool, RejectsShapesThatAreNotABag) {
  AttentionPool pool;
  EXPECT_EQ(pool.infer({{9, 1}, {9, 16}, {1}}), (Shape{1, 16}));
  EXPECT_EQ(pool.infer({{9, 3}, {9, 16}, {1}}), (Shape{1, 48}));
  EXPECT_THROW(pool.infer({{9, 0}, {9, 16}, {1}}), ShapeError);
  EXPECT_THROW(pool.infer({{8, 1}, {9, 16}, {1}}), ShapeError);
  EXPECT_THROW(pool.infer({{9, 1}, {9, 16}}), ShapeError);
}

}  // namespace
}  // namespace tessera
