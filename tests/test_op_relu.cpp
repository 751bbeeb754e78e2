// ReLU against the CPU and central differences.
#include <gtest/gtest.h>

#include "compute/ops/relu.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

TEST(Relu, ForwardMatchesCpu) {
  Relu relu;
  test::OpCheck check(test::context(), relu, {{3, 5, 7, 9}});
  auto y = check.forward();
  std::vector<float> expected(check.inputs[0].size());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = std::max(check.inputs[0][i], 0.0f);
  test::expect_near(y, expected, 0, "relu");
}

TEST(Relu, BackwardMatchesFiniteDifferences) {
  Relu relu;
  test::OpCheck check(test::context(), relu, {{2, 3, 5, 5}});
  // Keep inputs away from the kink at 0, where differences are not derivatives.
  for (auto& x : check.inputs[0]) x = x >= 0 ? x + 0.05f : x - 0.05f;
  check.expect_gradients_match();
}

}  // namespace
}  // namespace tessera
