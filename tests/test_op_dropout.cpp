// Dropout: the mask against a CPU twin of shaders/common.glsl's generator, evaluation as the
// identity, micro-batches that draw the masks of the whole batch, and central differences.
#include <gtest/gtest.h>

#include "compute/ops/dropout.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

std::unique_ptr<Op> make(float p, const std::string& name = "drop") {
  return make_dropout(LayerConfig({{"name", name}, {"type", "dropout"}, {"p", p}}));
}

// Forward at a given step and sample offset, which the other checks leave at 0.
std::vector<float> run_forward(Op& op, const std::vector<float>& x, const Shape& shape, uint32_t step,
                               uint32_t sample_offset) {
  test::OpCheck check(test::context(), op, {shape}, 42);
  check.inputs[0] = x;
  check.step = step;
  check.sample_offset = sample_offset;
  return check.forward();
}

TEST(Dropout, RejectsProbabilityOutsideRange) {
  EXPECT_THROW(make(1.0f), ModelError);
  EXPECT_THROW(make(-0.1f), ModelError);
}

TEST(Dropout, EvaluationIsTheIdentity) {
  auto op = make(0.5f);
  test::OpCheck check(test::context(), *op, {{4, 3, 5, 5}});
  check.training = false;
  test::expect_near(check.forward(), check.inputs[0], 0, "dropout in evaluation");
}

TEST(Dropout, ZeroesAboutPAndScalesTheRest) {
  const float p = 0.3f;
  auto op = make(p);
  test::OpCheck check(test::context(), *op, {{8, 4, 9, 9}});
  auto y = check.forward();
  size_t dropped = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0) {
      ++dropped;
      continue;
    }
    EXPECT_NEAR(y[i], check.inputs[0][i] / (1 - p), 1e-6) << i;
  }
  double fraction = static_cast<double>(dropped) / static_cast<double>(y.size());
  EXPECT_NEAR(fraction, p, 0.03);
}

TEST(Dropout, MicroBatchesDrawTheMasksOfTheWholeBatch) {
  auto op = make(0.5f);
  Shape whole{6, 3, 4, 5};
  auto x = test::random_values(static_cast<size_t>(element_count(whole)), 3, 0.5f, 1.5f);
  auto expected = run_forward(*op, x, whole, 7, 0);
  size_t half = x.size() / 2;
  auto first = run_forward(*op, {x.begin(), x.begin() + static_cast<std::ptrdiff_t>(half)}, {3, 3, 4, 5}, 7, 0);
  auto second = run_forward(*op, {x.begin() + static_cast<std::ptrdiff_t>(half), x.end()}, {3, 3, 4, 5}, 7, 3);
  first.insert(first.end(), second.begin(), second.end());
  test::expect_near(first, expected, 0, "two micro-batches");
}

TEST(Dropout, MasksChangeWithStepAndLayerButNotBetweenRuns) {
  Shape shape{4, 50};
  auto x = test::random_values(200, 5, 0.5f, 1.5f);
  auto op = make(0.5f), other_layer = make(0.5f, "drop2");
  auto once = run_forward(*op, x, shape, 3, 0);
  EXPECT_EQ(run_forward(*op, x, shape, 3, 0), once);
  EXPECT_NE(run_forward(*op, x, shape, 4, 0), once);
  EXPECT_NE(run_forward(*other_layer, x, shape, 3, 0), once);
}

TEST(Dropout, BackwardMatchesFiniteDifferences) {
  auto op = make(0.4f);
  test::OpCheck check(test::context(), *op, {{3, 2, 5, 7}});
  check.expect_gradients_match();
}

}  // namespace
}  // namespace tessera
