// instance_max against a CPU reference (bags of 1, 7 and 10,001 instances, fp32 and fp16, padding
// rows past the count), ties going to the first row, and central differences.
#include <gtest/gtest.h>

#include <bit>

#include "compute/ops/instance_max.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t rows, width, count;
};

void expect_forward_and_backward(const Case& c, DType activations, bool ties) {
  SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.width) + " count " + std::to_string(c.count) +
               (activations == DType::f16 ? " fp16" : " fp32") + (ties ? " ties" : ""));
  InstanceMax max;
  test::OpCheck check(test::context(), max, {{c.rows, c.width}, {1}}, 5, {DType::f32, DType::u32}, {}, activations);
  check.inputs[1] = {static_cast<float>(c.count)};
  auto& h = check.inputs[0];
  // Padding rows hold the largest values, which the op must not see.
  for (int64_t i = c.count * c.width; i < c.rows * c.width; ++i) h[i] = 100;
  // Ties: a few values repeated down each column, so that several rows hold the column's max.
  if (ties)
    for (int64_t n = 0; n < c.count; ++n)
      for (int64_t d = 0; d < c.width; ++d) h[n * c.width + d] = static_cast<float>((n * 7 + d * 3) % 5);
  auto rows = test::first_argmax_rows(h, c.count, c.width);
  std::vector<float> expected(static_cast<size_t>(c.width));
  for (int64_t d = 0; d < c.width; ++d) expected[d] = h[rows[d] * c.width + d];
  test::expect_near(check.forward(), expected, 0, "z");  // a copy of one input: exact
  auto argmax = check.tensor_after_run(0);  // u32 bits, read back as floats
  for (int64_t d = 0; d < c.width; ++d)
    EXPECT_EQ(std::bit_cast<uint32_t>(argmax[d]), static_cast<uint32_t>(rows[d])) << "argmax[" << d << "]";

  auto dz = test::random_values(static_cast<size_t>(c.width), 9);
  if (activations == DType::f16) dz = from_half(to_half(dz));
  std::vector<float> dh(static_cast<size_t>(c.rows * c.width), 0.0f);
  for (int64_t d = 0; d < c.width; ++d) dh[rows[d] * c.width + d] = dz[d];
  test::expect_near(check.backward(dz)[0], dh, 0, "dh");
}

TEST(InstanceMax, ForwardAndBackwardMatchCpuOnBagsOf1And7And10001) {
  for (DType activations : {DType::f32, DType::f16}) {
    for (const Case& c : {Case{1, 1, 1}, Case{1, 16, 1}, Case{7, 5, 7}, Case{12, 33, 7}, Case{10001, 24, 10001},
                          Case{10010, 3, 10001}})
      expect_forward_and_backward(c, activations, false);
  }
}

TEST(InstanceMax, TiesGoToTheFirstInstanceOnEveryRun) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {Case{7, 5, 7}, Case{10001, 6, 10001}}) expect_forward_and_backward(c, activations, true);
}

TEST(InstanceMax, BackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{6, 4, 4}, Case{5, 7, 5}, Case{3, 2, 1}}) {
    InstanceMax max;
    test::OpCheck check(test::context(), max, {{c.rows, c.width}, {1}}, 2, {DType::f32, DType::u32});
    check.inputs[1] = {static_cast<float>(c.count)};
    check.expect_gradients_match();
  }
}

// A bag past what one binding reaches (4 KiB here) is read a window of rows at a time: fp32's
// windows of 192 rows, fp16's of 384, the last ones past the count. The maxima and the rows
// they come from (backward's gradient) are the whole bag's.
TEST(InstanceMax, WindowsOfRowsMatchTheWholeBag) {
  for (DType activations : {DType::f32, DType::f16}) {
    SCOPED_TRACE(activations == DType::f16 ? "fp16" : "fp32");
    InstanceMax max;
    test::OpCheck check(test::context(), max, {{600, 5}, {1}}, 3, {DType::f32, DType::u32}, {}, activations);
    check.inputs[1] = {450.0f};
    const std::vector<float> dz = test::random_values(5, 4);
    const std::vector<float> whole = check.forward();
    const auto whole_grads = check.backward(dz);
    test::TileTargetScope scope(test::context(), test::binding_at_most(test::context(), 4096));
    EXPECT_EQ(check.forward(), whole);
    EXPECT_EQ(check.backward(dz), whole_grads);
  }
}

TEST(InstanceMax, RejectsShapesThatAreNotABag) {
  InstanceMax max;
  EXPECT_EQ(max.infer({{9, 16}, {1}}), (Shape{1, 16}));
  EXPECT_THROW(max.infer({{9, 16}}), ShapeError);
  EXPECT_THROW(max.infer({{9, 4, 4}, {1}}), ShapeError);
}

}  // namespace
}  // namespace tessera
