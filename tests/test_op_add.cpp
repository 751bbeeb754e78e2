// Residual add against the CPU and central differences.
#include <gtest/gtest.h>

#include "compute/ops/add.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

TEST(Add, RejectsDifferentShapes) {
  Add add;
  EXPECT_THROW(add.infer({{2, 3, 5, 5}, {2, 3, 5, 4}}), ShapeError);
  EXPECT_THROW(add.infer({{2, 3}}), ShapeError);
}

TEST(Add, ForwardMatchesCpu) {
  Add add;
  test::OpCheck check(test::context(), add, {{3, 5, 7, 9}, {3, 5, 7, 9}});
  auto y = check.forward();
  std::vector<float> expected(y.size());
  for (size_t i = 0; i < y.size(); ++i) expected[i] = check.inputs[0][i] + check.inputs[1][i];
  test::expect_near(y, expected, 0, "add");
}

TEST(Add, BackwardMatchesFiniteDifferences) {
  Add add;
  test::OpCheck check(test::context(), add, {{2, 3, 5, 7}, {2, 3, 5, 7}});
  check.expect_gradients_match();
}

}  // namespace
}  // namespace tessera
