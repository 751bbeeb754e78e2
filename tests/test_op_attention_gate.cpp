// attention_gate against the CPU and central differences.
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/attention_gate.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

TEST(AttentionGate, ForwardMatchesCpu) {
  AttentionGate gate;
  test::OpCheck check(test::context(), gate, {{37, 11}, {37, 11}});
  for (auto& b : check.inputs[1]) b *= 4;  // sigmoid beyond its linear middle
  std::vector<float> expected(check.inputs[0].size());
  for (size_t i = 0; i < expected.size(); ++i)
    expected[i] = std::tanh(check.inputs[0][i]) / (1.0f + std::exp(-check.inputs[1][i]));
  test::expect_near(check.forward(), expected, 1e-5, "y");
}

TEST(AttentionGate, BackwardMatchesFiniteDifferences) {
  AttentionGate gate;
  test::OpCheck check(test::context(), gate, {{5, 6}, {5, 6}});
  check.expect_gradients_match();
}

TEST(AttentionGate, RejectsInputsOfDifferentShapes) {
  AttentionGate gate;
  EXPECT_THROW(gate.infer({{4, 8}, {4, 9}}), ShapeError);
  EXPECT_THROW(gate.infer({{4, 8}}), ShapeError);
}

}  // namespace
}  // namespace tessera
