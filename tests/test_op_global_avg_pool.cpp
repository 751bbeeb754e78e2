// Global average pooling against the CPU and central differences.
#include <gtest/gtest.h>

#include "compute/ops/global_avg_pool.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

TEST(GlobalAvgPool, ShapeDropsThePlane) {
  GlobalAvgPool pool;
  EXPECT_EQ(pool.infer({{16, 512, 7, 7}}), (Shape{16, 512}));
  EXPECT_THROW(pool.infer({{16, 512}}), ShapeError);
}

TEST(GlobalAvgPool, ForwardMatchesCpu) {
  GlobalAvgPool pool;
  Shape in{3, 5, 7, 9};
  test::OpCheck check(test::context(), pool, {in});
  std::vector<float> expected(15);
  for (size_t plane = 0; plane < 15; ++plane) {
    double sum = 0;
    for (size_t i = 0; i < 63; ++i) sum += check.inputs[0][plane * 63 + i];
    expected[plane] = static_cast<float>(sum / 63);
  }
  test::expect_near(check.forward(), expected, 1e-6, "global_avg_pool");
}

TEST(GlobalAvgPool, BackwardMatchesFiniteDifferences) {
  GlobalAvgPool pool;
  test::OpCheck check(test::context(), pool, {{2, 3, 5, 7}});
  check.expect_gradients_match(1e-2, 1e-3);
}

}  // namespace
}  // namespace tessera
