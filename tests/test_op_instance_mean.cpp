// instance_mean against the CPU and central differences, with padding rows past the count.
#include <gtest/gtest.h>

#include "compute/ops/instance_mean.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t rows, width, count;
};

TEST(InstanceMean, ForwardMatchesCpuAndIgnoresPadding) {
  for (const Case& c : {Case{7, 5, 7}, Case{40, 33, 23}, Case{1, 1, 1}, Case{300, 3, 299}}) {
    InstanceMean mean;
    test::OpCheck check(test::context(), mean, {{c.rows, c.width}, {1}}, 1, {DType::f32, DType::u32});
    check.inputs[1] = {static_cast<float>(c.count)};
    std::vector<float> expected(static_cast<size_t>(c.width));
    for (int64_t d = 0; d < c.width; ++d) {
      double sum = 0;
      for (int64_t n = 0; n < c.count; ++n) sum += check.inputs[0][n * c.width + d];
      expected[d] = static_cast<float>(sum / c.count);
    }
    test::expect_near(check.forward(), expected, 1e-5, "z");
  }
}

TEST(InstanceMean, BackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{6, 4, 4}, Case{5, 7, 5}}) {
    InstanceMean mean;
    test::OpCheck check(test::context(), mean, {{c.rows, c.width}, {1}}, 2, {DType::f32, DType::u32});
    check.inputs[1] = {static_cast<float>(c.count)};
    check.expect_gradients_match();
  }
}

// A bag past what one binding reaches (4 KiB here) is read a window of rows at a time: fp32's
// windows of 192 rows, fp16's of 384, the last ones past the count.
TEST(InstanceMean, WindowsOfRowsMatchTheWholeBag) {
  for (DType activations : {DType::f32, DType::f16}) {
    SCOPED_TRACE(activations == DType::f16 ? "fp16" : "fp32");
    InstanceMean mean;
    test::OpCheck check(test::context(), mean, {{600, 5}, {1}}, 3, {DType::f32, DType::u32}, {}, activations);
    check.inputs[1] = {450.0f};
    const std::vector<float> whole = check.forward();
    test::TileTargetScope scope(test::context(), test::binding_at_most(test::context(), 4096));
    test::expect_near(check.forward(), whole, test::forward_tolerance(activations), "z");
  }
}

TEST(InstanceMean, RejectsShapesThatAreNotABag) {
  InstanceMean mean;
  EXPECT_EQ(mean.infer({{9, 16}, {1}}), (Shape{1, 16}));
  EXPECT_THROW(mean.infer({{9, 16}}), ShapeError);
  EXPECT_THROW(mean.infer({{9, 4, 4}, {1}}), ShapeError);
}

}  // namespace
}  // namespace tessera
