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

// A small-cnn activation (18.9M elements): kernels that read through texel views must reach
// every element, including those past 2^23 where a one-row dispatch no longer covers a
// scalar kernel (lavapipe returned zeros there from texel fetches in a second row).
TEST(Relu, LargeTensorMatchesCpu) {
  Relu relu;
  test::OpCheck check(test::context(), relu, {{64, 32, 96, 96}});
  const auto& x = check.inputs[0];
  std::vector<float> expected(x.size()), dy = test::random_values(x.size(), 7), expected_dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    expected[i] = std::max(x[i], 0.0f);
    expected_dx[i] = x[i] > 0 ? dy[i] : 0.0f;
  }
  test::expect_near(check.forward(), expected, 0, "relu forward");
  test::expect_near(check.backward(dy)[0], expected_dx, 0, "relu backward");
}

}  // namespace
}  // namespace tessera
