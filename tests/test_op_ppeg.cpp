// ppeg (TransMIL's PPEG: three depthwise convolutions of the sequence's square grid added to it)
// against a CPU loop in doubles written as PyTorch's three Conv2d, forward (training and
// prepared inference) and backward, fp32 and fp16, for bags smaller than the sequence's largest
// grid: rows past 1 + side^2 must be zero and get no gradient, whatever the input holds there.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include "compute/ops/ppeg.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t bag_rows;  // M: the sequence holds 1 + side(M)^2 rows
  int64_t width, count;
};

// n = 1, 2, 7 (side 3), 9 (side^2 = n), 10 and 16 within a sequence of side 4; a grid of 2209
// pixels (two blocks of the weight gradient's first pass); 100,000 patches (side 317, the loops'
// bound on lavapipe).
const Case kSmallCases[] = {{12, 5, 1}, {12, 5, 2}, {12, 8, 7}, {12, 5, 9}, {12, 5, 10}, {16, 3, 16}};
const Case kLargeCases[] = {{2300, 3, 2200}, {100000, 2, 99999}};

int64_t side_of(int64_t n) {
  int64_t side = 0;
  while (side * side < n) ++side;
  return side;
}

constexpr std::array<int64_t, 3> kKernels{7, 5, 3};  // proj, proj1, proj2

// PPEG in doubles, with every pixel's contributions scattered (the device gathers them):
// y = x on the class row and the grid, plus each kernel's taps and bias on the grid; the
// gradients of x, of the three kernels and of the three biases for the upstream dy.
struct Reference {
  std::vector<double> y, dx;
  std::array<std::vector<double>, 6> dparameters;  // tensors()'s order: proj.weight, proj.bias, ...

  Reference(const std::vector<float>& x, const std::vector<std::vector<float>>& parameters, const std::vector<float>& dy,
            int64_t rows, int64_t width, int64_t count) {
    const int64_t side = side_of(count);
    y.assign(static_cast<size_t>(rows * width), 0.0);
    dx = y;
    for (size_t k = 0; k < 3; ++k) {
      dparameters[2 * k].assign(parameters[2 * k].size(), 0.0);
      dparameters[2 * k + 1].assign(parameters[2 * k + 1].size(), 0.0);
    }
    auto at = [&](int64_t i, int64_t j, int64_t c) { return static_cast<size_t>((1 + i * side + j) * width + c); };
    for (int64_t c = 0; c < width; ++c) {
      y[c] = x[c];
      dx[c] = dy[c];
    }
    for (int64_t i = 0; i < side; ++i)
      for (int64_t j = 0; j < side; ++j)
        for (int64_t c = 0; c < width; ++c) {
          const size_t out = at(i, j, c);
          y[out] += x[out];
          dx[out] += dy[out];
          for (size_t k = 0; k < 3; ++k) {
            const int64_t size = kKernels[k], pad = size / 2;
            const auto& weight = parameters[2 * k];
            y[out] += parameters[2 * k + 1][c];
            dparameters[2 * k + 1][c] += dy[out];
            for (int64_t a = 0; a < size; ++a)
              for (int64_t b = 0; b < size; ++b) {
                const int64_t si = i + a - pad, sj = j + b - pad;
                if (si < 0 || si >= side || sj < 0 || sj >= side) continue;
                const size_t tap = static_cast<size_t>((c * size + a) * size + b), in = at(si, sj, c);
                y[out] += weight[tap] * static_cast<double>(x[in]);
                dx[in] += weight[tap] * static_cast<double>(dy[out]);
                dparameters[2 * k][tap] += static_cast<double>(dy[out]) * x[in];
              }
          }
        }
  }
};

std::vector<float> as_floats(const std::vector<double>& values) { return {values.begin(), values.end()}; }

void expect_ppeg_matches(const Case& c, DType activations) {
  SCOPED_TRACE("M " + std::to_string(c.bag_rows) + " width " + std::to_string(c.width) + " count " +
               std::to_string(c.count) + (activations == DType::f16 ? " fp16" : " fp32"));
  const int64_t side = side_of(c.bag_rows), rows = 1 + side * side;
  Ppeg ppeg;
  test::OpCheck check(test::context(), ppeg, {{1, rows, c.width}, {1}}, 7, {DType::f32, DType::u32}, {}, activations);
  check.inputs[1] = {static_cast<float>(c.count)};
  auto dy = from_half(to_half(test::random_values(static_cast<size_t>(rows * c.width), 8)));
  const Reference expected(check.inputs[0], check.tensors, dy, rows, c.width, c.count);
  const double tolerance = test::forward_tolerance(activations);
  test::expect_near(check.forward(), as_floats(expected.y), tolerance, "y");
  test::expect_near(check.forward_prepared(), as_floats(expected.y), tolerance, "y (prepared)");

  auto grads = check.backward(dy);
  ASSERT_EQ(grads.size(), 8u);  // dx, none for the count, then the six parameters'
  test::expect_near(grads[0], as_floats(expected.dx), tolerance, "dx");
  for (size_t i = static_cast<size_t>((1 + side_of(c.count) * side_of(c.count)) * c.width); i < grads[0].size(); ++i)
    ASSERT_EQ(grads[0][i], 0.0f) << "dx of padding row " << i / static_cast<size_t>(c.width);
  // Sums over the grid in float of products of stored values: both precisions alike.
  const char* names[] = {"dproj.weight", "dproj.bias", "dproj1.weight", "dproj1.bias", "dproj2.weight", "dproj2.bias"};
  for (size_t p = 0; p < 6; ++p) test::expect_near(grads[2 + p], as_floats(expected.dparameters[p]), 1e-4, names[p]);
}

TEST(Ppeg, MatchesCpuWithPaddingRows) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : kSmallCases) expect_ppeg_matches(c, activations);
}

TEST(Ppeg, MatchesCpuOnLargeGrids) {
  for (const Case& c : kLargeCases) expect_ppeg_matches(c, DType::f32);
}

TEST(Ppeg, BackwardMatchesFiniteDifferencesAndAccumulates) {
  Ppeg ppeg;
  test::OpCheck check(test::context(), ppeg, {{1, 10, 2}, {1}}, 9, {DType::f32, DType::u32});
  check.inputs[1] = {7};
  check.expect_gradients_match();
}

TEST(Ppeg, ParametersAreTransmilsAndShapesAreChecked) {
  Ppeg ppeg;
  EXPECT_EQ(ppeg.infer({{1, 17, 8}, {1}}), (Shape{1, 17, 8}));
  std::vector<std::string> names;
  const auto specs = ppeg.tensors();
  for (size_t s = 0; s < 6; ++s) {
    names.push_back(tensor_name("pos_layer", specs[s]));
    // PyTorch's Conv2d init over a depthwise fan-in of k * k: U(-1/k, 1/k), weight and bias alike
    EXPECT_EQ(specs[s].role, TensorRole::parameter);
    EXPECT_EQ(specs[s].init.kind, Init::uniform);
    EXPECT_FLOAT_EQ(specs[s].init.scale, 1.0f / static_cast<float>(kKernels[s / 2])) << names.back();
  }
  EXPECT_EQ(names, (std::vector<std::string>{"pos_layer.proj.weight", "pos_layer.proj.bias", "pos_layer.proj1.weight",
                                             "pos_layer.proj1.bias", "pos_layer.proj2.weight", "pos_layer.proj2.bias"}));
  EXPECT_THROW(ppeg.infer({{1, 16, 8}, {1}}), ShapeError);  // 15 is no square
  EXPECT_THROW(ppeg.infer({{2, 17, 8}, {1}}), ShapeError);
  EXPECT_THROW(ppeg.infer({{1, 17, 8}}), ShapeError);
}

}  // namespace
}  // namespace tessera
