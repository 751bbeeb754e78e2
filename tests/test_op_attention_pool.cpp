// attention_pool against the CPU and central differences, with padding rows past the count.
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/attention_pool.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t rows, width, count;
};

TEST(AttentionPool, ForwardMatchesCpuAndIgnoresPadding) {
  for (const Case& c : {Case{7, 5, 7}, Case{40, 33, 23}, Case{1, 1, 1}, Case{300, 3, 299}}) {
    AttentionPool pool;
    test::OpCheck check(test::context(), pool, {{c.rows, 1}, {c.rows, c.width}, {1}}, 3,
                        {DType::f32, DType::f32, DType::u32});
    for (auto& s : check.inputs[0]) s *= 5;  // a peaked softmax
    check.inputs[2] = {static_cast<float>(c.count)};
    const auto& scores = check.inputs[0];
    double largest = scores[0], total = 0;
    for (int64_t n = 0; n < c.count; ++n) largest = std::max<double>(largest, scores[n]);
    for (int64_t n = 0; n < c.count; ++n) total += std::exp(scores[n] - largest);
    std::vector<float> expected(static_cast<size_t>(c.width));
    for (int64_t d = 0; d < c.width; ++d) {
      double sum = 0;
      for (int64_t n = 0; n < c.count; ++n)
        sum += std::exp(scores[n] - largest) / total * check.inputs[1][n * c.width + d];
      expected[d] = static_cast<float>(sum);
    }
    test::expect_near(check.forward(), expected, 1e-5, "z");
  }
}

TEST(AttentionPool, BackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{6, 4, 4}, Case{5, 7, 5}, Case{9, 3, 1}}) {
    AttentionPool pool;
    test::OpCheck check(test::context(), pool, {{c.rows, 1}, {c.rows, c.width}, {1}}, 4,
                        {DType::f32, DType::f32, DType::u32});
    check.inputs[2] = {static_cast<float>(c.count)};
    check.expect_gradients_match();
  }
}

TEST(AttentionPool, RejectsShapesThatAreNotABag) {
  AttentionPool pool;
  EXPECT_EQ(pool.infer({{9, 1}, {9, 16}, {1}}), (Shape{1, 16}));
  EXPECT_THROW(pool.infer({{9, 2}, {9, 16}, {1}}), ShapeError);
  EXPECT_THROW(pool.infer({{8, 1}, {9, 16}, {1}}), ShapeError);
  EXPECT_THROW(pool.infer({{9, 1}, {9, 16}}), ShapeError);
}

}  // namespace
}  // namespace tessera
