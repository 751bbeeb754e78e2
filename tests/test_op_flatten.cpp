// Flatten against the CPU and central differences.
#include <gtest/gtest.h>

#include "compute/ops/flatten.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

TEST(Flatten, KeepsTheBatchDimension) {
  Flatten flatten;
  EXPECT_EQ(flatten.infer({{4, 3, 5, 7}}), (Shape{4, 105}));
  EXPECT_EQ(flatten.infer({{4, 10}}), (Shape{4, 10}));
}

TEST(Flatten, ForwardCopies) {
  Flatten flatten;
  test::OpCheck check(test::context(), flatten, {{3, 5, 7, 9}});
  test::expect_near(check.forward(), check.inputs[0], 0, "flatten");
}

TEST(Flatten, BackwardMatchesFiniteDifferences) {
  Flatten flatten;
  test::OpCheck check(test::context(), flatten, {{2, 3, 5, 7}});
  check.expect_gradients_match();
}

}  // namespace
}  // namespace tessera
