// transmil_sequence (TransMIL's class token, bag and wrap-around padding to a square) against a
// CPU loop in doubles, forward and backward, fp32 and fp16, for bags smaller than their padding:
// rows past 1 + side^2 must be zero, and rows past the count get no gradient.
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/transmil_sequence.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t rows, width, count;
};

// n = 1, 2, 7 (side 3: two cells repeat), 9 (side^2 = n) and 10 inside a bag padded to 12
// (side 4 at most: 17 rows), and a bag of 100,000 (side 317: the loops' bound on lavapipe).
const Case kCases[] = {{12, 5, 1}, {12, 5, 2}, {12, 8, 7}, {12, 5, 9}, {12, 5, 10}, {12, 3, 12}, {100000, 2, 99999}};

int64_t side_of(int64_t n) {
  int64_t side = 0;
  while (side * side < n) ++side;
  return side;
}

// The instance row that sequence row s > 0 holds, or -1 past 1 + side^2: TransMIL's
// cat([cls_token, h, h[:add_length]]).
int64_t source_row(int64_t s, int64_t n) {
  int64_t side = side_of(n), r = s - 1;
  if (r >= side * side) return -1;
  return r < n ? r : r - n;
}

std::string describe(const Case& c, DType activations) {
  return std::to_string(c.rows) + "x" + std::to_string(c.width) + " count " + std::to_string(c.count) +
         (activations == DType::f16 ? " fp16" : " fp32");
}

TEST(TransmilGridSide, IsTheLeastSideWhoseSquareHoldsTheBag) {
  for (int64_t n = 0; n < 5000; ++n) EXPECT_EQ(transmil_grid_side(n), side_of(n)) << n;
  // Past 2^53 a double misses whole numbers: the square root's estimate is corrected.
  for (int64_t side : {317LL, 4096LL, 65535LL, 94906265LL, 94906267LL, 2147483647LL}) {
    EXPECT_EQ(transmil_grid_side(side * side), side);
    EXPECT_EQ(transmil_grid_side(side * side + 1), side + 1);
    EXPECT_EQ(transmil_grid_side(side * side - 1), side);
  }
}

TEST(TransmilSequence, ForwardMatchesCpu) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : kCases) {
      SCOPED_TRACE(describe(c, activations));
      TransmilSequence sequence;
      test::OpCheck check(test::context(), sequence, {{c.rows, c.width}, {1}}, 3, {DType::f32, DType::u32}, {},
                          activations);
      check.inputs[1] = {static_cast<float>(c.count)};
      const int64_t sequence_rows = 1 + side_of(c.rows) * side_of(c.rows);
      ASSERT_EQ(check.output_shape, (Shape{1, sequence_rows, c.width}));
      std::vector<float> expected(static_cast<size_t>(sequence_rows * c.width), 0.0f);
      for (int64_t d = 0; d < c.width; ++d) expected[d] = check.tensors[0][d];
      if (activations == DType::f16) expected = from_half(to_half(expected));  // the class token, stored
      for (int64_t s = 1; s < sequence_rows; ++s)
        if (int64_t r = source_row(s, c.count); r >= 0)
          for (int64_t d = 0; d < c.width; ++d) expected[s * c.width + d] = check.inputs[0][r * c.width + d];
      // Copies: exact in fp32, the padding's zeros included (fp16 rounds the class token once).
      test::expect_near(check.forward(), expected, activations == DType::f16 ? test::forward_tolerance(activations) : 0,
                        "y");
    }
}

TEST(TransmilSequence, BackwardMatchesCpu) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : kCases) {
      SCOPED_TRACE(describe(c, activations));
      TransmilSequence sequence;
      test::OpCheck check(test::context(), sequence, {{c.rows, c.width}, {1}}, 4, {DType::f32, DType::u32}, {},
                          activations);
      check.inputs[1] = {static_cast<float>(c.count)};
      auto dy = test::random_values(static_cast<size_t>(element_count(check.output_shape)), 5);
      dy = from_half(to_half(dy));  // fp16 values in either run
      std::vector<float> dh(static_cast<size_t>(c.rows * c.width), 0.0f), dcls(dy.begin(), dy.begin() + c.width);
      const int64_t sequence_rows = check.output_shape[1];
      for (int64_t s = 1; s < sequence_rows; ++s)
        if (int64_t r = source_row(s, c.count); r >= 0)
          for (int64_t d = 0; d < c.width; ++d) dh[r * c.width + d] += dy[s * c.width + d];
      auto grads = check.backward(dy);
      ASSERT_EQ(grads.size(), 3u);
      test::expect_near(grads[0], dh, test::forward_tolerance(activations), "dh");
      for (size_t i = static_cast<size_t>(c.count * c.width); i < grads[0].size(); ++i)
        ASSERT_EQ(grads[0][i], 0.0f) << "dh of padding row " << i / static_cast<size_t>(c.width);
      test::expect_near(grads[2], dcls, 1e-6, "dcls_token");
    }
}

TEST(TransmilSequence, BackwardMatchesFiniteDifferencesAndAccumulates) {
  for (const Case& c : {Case{12, 3, 7}, Case{5, 2, 4}}) {
    TransmilSequence sequence;
    test::OpCheck check(test::context(), sequence, {{c.rows, c.width}, {1}}, 6, {DType::f32, DType::u32});
    check.inputs[1] = {static_cast<float>(c.count)};
    check.expect_gradients_match();
  }
}

TEST(TransmilSequence, ClassTokenIsTheModelsOwnAndShapesAreChecked) {
  TransmilSequence sequence;
  EXPECT_EQ(sequence.infer({{10, 16}, {1}}), (Shape{1, 17, 16}));
  EXPECT_EQ(sequence.infer({{9, 16}, {1}}), (Shape{1, 10, 16}));
  auto specs = sequence.tensors();
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(tensor_name("sequence", specs[0]), "cls_token");
  EXPECT_EQ(specs[0].shape, (Shape{1, 1, 16}));
  EXPECT_EQ(specs[0].role, TensorRole::parameter);
  EXPECT_EQ(specs[0].init.kind, Init::normal);
  EXPECT_EQ(specs[0].init.scale, 1.0f);
  EXPECT_THROW(sequence.infer({{9, 16}}), ShapeError);
  EXPECT_THROW(sequence.infer({{9, 4, 4}, {1}}), ShapeError);
  EXPECT_THROW(sequence.infer({{0, 4}, {1}}), ShapeError);
}

}  // namespace
}  // namespace tessera
