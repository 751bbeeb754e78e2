// critical_instance_scores (DSMIL's attention to the critical instance) against a CPU reference
// on bags whose sizes are not multiples of a workgroup (1, 7, 23 of 40 rows, 10,001), fp32 and
// fp16, padding rows past the count; ties of the instance logits going to the first instance;
// the queries' gradient against central differences, and none reaching the logits.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "compute/ops/critical_instance_scores.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t rows, width, classes, count;
};

std::string describe(const Case& c, DType activations) {
  return std::to_string(c.rows) + "x" + std::to_string(c.width) + " classes " + std::to_string(c.classes) + " count " +
         std::to_string(c.count) + (activations == DType::f16 ? " fp16" : " fp32");
}

void expect_forward_and_backward(const Case& c, DType activations, bool ties) {
  SCOPED_TRACE(describe(c, activations) + (ties ? " ties" : ""));
  CriticalInstanceScores op;
  test::OpCheck check(test::context(), op, {{c.rows, c.width}, {c.rows, c.classes}, {1}}, 3,
                      {DType::f32, DType::f32, DType::u32}, {}, activations);
  check.inputs[2] = {static_cast<float>(c.count)};
  auto& q = check.inputs[0];
  auto& logits = check.inputs[1];
  // Padding rows hold the largest logits, which the op must not see.
  for (int64_t i = c.count * c.classes; i < c.rows * c.classes; ++i) logits[i] = 100;
  if (ties)  // a few whole values: several rows share each class's largest logit
    for (int64_t n = 0; n < c.count; ++n)
      for (int64_t k = 0; k < c.classes; ++k) logits[n * c.classes + k] = static_cast<float>((n * 5 + k * 3) % 4);
  auto critical = test::first_argmax_rows(logits, c.count, c.classes);  // the first of the bag's largest logits
  const double scale = 1 / std::sqrt(static_cast<double>(c.width));
  auto dot = [&](int64_t a, int64_t b) {
    double sum = 0;
    for (int64_t k = 0; k < c.width; ++k) sum += static_cast<double>(q[a * c.width + k]) * q[b * c.width + k];
    return sum;
  };
  std::vector<float> expected(static_cast<size_t>(c.rows * c.classes), 0.0f);
  for (int64_t n = 0; n < c.count; ++n)
    for (int64_t k = 0; k < c.classes; ++k)
      expected[n * c.classes + k] = static_cast<float>(dot(n, critical[k]) * scale);
  test::expect_near(check.forward(), expected, test::forward_tolerance(activations), "s");
  auto saved = check.tensor_after_run(0);  // u32 bits, read back as floats
  for (int64_t k = 0; k < c.classes; ++k)
    EXPECT_EQ(std::bit_cast<uint32_t>(saved[k]), static_cast<uint32_t>(critical[k])) << "critical[" << k << "]";

  // dQ: each instance's own term, and every instance's score added into the critical rows.
  auto ds = test::random_values(static_cast<size_t>(c.rows * c.classes), 11);
  if (activations == DType::f16) ds = from_half(to_half(ds));
  std::vector<double> dq(static_cast<size_t>(c.rows * c.width), 0.0);
  for (int64_t n = 0; n < c.count; ++n)
    for (int64_t k = 0; k < c.classes; ++k)
      for (int64_t d = 0; d < c.width; ++d) {
        double g = ds[n * c.classes + k] * scale;
        dq[n * c.width + d] += g * q[critical[k] * c.width + d];
        dq[critical[k] * c.width + d] += g * q[n * c.width + d];
      }
  auto grads = check.backward(ds);
  // fp16: the gradient is stored once in fp16; fp32: sums of up to 10,001 float products.
  double tolerance = activations == DType::f16 ? 4.0 / 2048 : 1e-4;
  test::expect_near(grads[0], std::vector<float>(dq.begin(), dq.end()), tolerance, "dQ");
  test::expect_near(grads[1], std::vector<float>(static_cast<size_t>(c.rows * c.classes), 0.0f), 0, "dlogits");
}

TEST(CriticalInstanceScores, ForwardAndBackwardMatchCpuOnBagsOf1And7And10001) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {Case{1, 1, 1, 1}, Case{1, 5, 2, 1}, Case{7, 5, 3, 7}, Case{40, 33, 2, 23},
                          Case{10001, 24, 2, 10001}, Case{10010, 3, 3, 10001}})
      expect_forward_and_backward(c, activations, false);
}

TEST(CriticalInstanceScores, TiesGoToTheFirstInstance) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {Case{7, 5, 3, 7}, Case{301, 6, 2, 300}}) expect_forward_and_backward(c, activations, true);
}

TEST(CriticalInstanceScores, QueryGradientMatchesFiniteDifferences) {
  // The logits only choose rows: central differences would step over their argmax, so only the
  // queries are differentiated here (the logits' gradient is checked to be zero above).
  for (const Case& c : {Case{6, 4, 2, 4}, Case{5, 7, 3, 5}, Case{3, 2, 1, 1}}) {
    CriticalInstanceScores op;
    test::OpCheck check(test::context(), op, {{c.rows, c.width}, {c.rows, c.classes}, {1}}, 2,
                        {DType::f32, DType::f32, DType::u32}, {true, false, false});
    check.inputs[2] = {static_cast<float>(c.count)};
    check.expect_gradients_match();
  }
}

TEST(CriticalInstanceScores, RejectsShapesThatAreNotABag) {
  CriticalInstanceScores op;
  EXPECT_EQ(op.infer({{9, 16}, {9, 3}, {1}}), (Shape{9, 3}));
  EXPECT_THROW(op.infer({{9, 16}, {8, 3}, {1}}), ShapeError);
  EXPECT_THROW(op.infer({{9, 16}, {9, 3}}), ShapeError);
  EXPECT_THROW(op.infer({{9, 16, 1}, {9, 3}, {1}}), ShapeError);
}

}  // namespace
}  // namespace tessera
