// nystrom_attention against a CPU reference written from lucidrains' nystrom_attention.py (the
// to_qkv projection, the front zero padding to a multiple of the landmarks, landmark means, three softmaxes, the
// iterative pseudo-inverse from the global maxima, the depthwise residual of v) and central
// differences, on bags whose sequence is shorter than its padding (rows past it 0), fp32 and fp16,
// the sequence taken whole and in chunks of a few rows (the last one shorter, some past the bag),
// and the class token's row alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "compute/ops/nystrom_attention.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

using Matrix = std::vector<std::vector<double>>;
using Output = NystromAttention::Output;

Matrix product(const Matrix& a, const Matrix& b, bool transpose_b = false) {
  size_t rows = a.size(), depth = b.size(), columns = transpose_b ? b.size() : b[0].size();
  if (transpose_b) depth = b[0].size();
  Matrix c(rows, std::vector<double>(columns));
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < columns; ++j)
      for (size_t k = 0; k < depth; ++k) c[i][j] += a[i][k] * (transpose_b ? b[j][k] : b[k][j]);
  return c;
}

void softmax_rows(Matrix& x) {
  for (auto& row : x) {
    double largest = *std::max_element(row.begin(), row.end()), sum = 0;
    for (double& v : row) sum += (v = std::exp(v - largest));
    for (double& v : row) v /= sum;
  }
}

struct Case {
  int64_t rows, width, heads, landmarks, count;
};

int64_t sequence_length(int64_t patches) {
  int64_t side = 1;
  while (side * side < patches) ++side;
  return 1 + side * side;
}

// out [rows, D] for input [rows, D], to_qkv.weight [3D, D] and res_conv.weight [heads, kernel], as
// nystrom_attention.py;
// with `class_attention`, each of the rows - 1 patches' mean over heads of the class token's row
// of a1 pinv a3 at its places in the sequence instead.
std::vector<float> reference(const Case& c, const std::vector<float>& input, const std::vector<float>& projection,
                             const std::vector<float>& weight, int iterations, int64_t kernel, bool class_attention = false) {
  const int64_t S = sequence_length(c.count), m = c.landmarks, D = c.width, d = D / c.heads;
  std::vector<double> qkv(static_cast<size_t>(c.rows * 3 * D));
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t o = 0; o < 3 * D; ++o)
      for (int64_t e = 0; e < D; ++e) qkv[i * 3 * D + o] += double{input[i * D + e]} * projection[o * D + e];
  const int64_t P = (S + m - 1) / m * m, pad = P - S, run = P / m;
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  std::vector<Matrix> q(c.heads, Matrix(P, std::vector<double>(d))), k = q, v = q, ql, kl, a2(c.heads);
  for (int64_t h = 0; h < c.heads; ++h) {
    for (int64_t i = 0; i < S; ++i)
      for (int64_t e = 0; e < d; ++e) {
        q[h][pad + i][e] = scale * qkv[i * 3 * D + h * d + e];
        k[h][pad + i][e] = qkv[i * 3 * D + D + h * d + e];
        v[h][pad + i][e] = qkv[i * 3 * D + 2 * D + h * d + e];
      }
    Matrix qm(m, std::vector<double>(d)), km = qm;
    for (int64_t j = 0; j < P; ++j)
      for (int64_t e = 0; e < d; ++e) {
        qm[j / run][e] += q[h][j][e] / static_cast<double>(run);
        km[j / run][e] += k[h][j][e] / static_cast<double>(run);
      }
    ql.push_back(qm);
    kl.push_back(km);
    a2[h] = product(qm, km, true);
    softmax_rows(a2[h]);
  }
  double row_max = 0, column_max = 0;
  for (auto& x : a2)
    for (int64_t i = 0; i < m; ++i) {
      double row = 0, column = 0;
      for (int64_t j = 0; j < m; ++j) row += std::abs(x[i][j]), column += std::abs(x[j][i]);
      row_max = std::max(row_max, row), column_max = std::max(column_max, column);
    }
  std::vector<float> out(static_cast<size_t>(c.rows * D)), scores(static_cast<size_t>(c.rows - 1));
  for (int64_t h = 0; h < c.heads; ++h) {
    Matrix z(m, std::vector<double>(m)), identity = z;
    for (int64_t i = 0; i < m; ++i) {
      identity[i][i] = 1;
      for (int64_t j = 0; j < m; ++j) z[i][j] = a2[h][j][i] / (row_max * column_max);
    }
    auto minus = [&](double s, const Matrix& x) {
      Matrix y = x;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < m; ++j) y[i][j] = s * identity[i][j] - x[i][j];
      return y;
    };
    for (int it = 0; it < iterations; ++it) {
      Matrix xz = product(a2[h], z);
      z = product(z, minus(13, product(xz, minus(15, product(xz, minus(7, xz))))));
      for (auto& row : z)
        for (double& value : row) value *= 0.25;
    }
    Matrix a1 = product(q[h], kl[h], true), a3 = product(ql[h], k[h], true);
    softmax_rows(a1);
    softmax_rows(a3);
    if (class_attention) {
      Matrix tokens = product(product(Matrix{a1[pad]}, z), a3);  // the class token is the first real row
      const auto side = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(S - 1))));
      for (int64_t r = 0; r < c.count; ++r) {
        double score = tokens[0][pad + 1 + r] + (r < side * side - c.count ? tokens[0][pad + 1 + c.count + r] : 0);
        scores[r] += static_cast<float>(score / static_cast<double>(c.heads));
      }
      continue;
    }
    Matrix mixed = product(product(a1, z), product(a3, v[h]));
    for (int64_t i = 0; i < S; ++i)
      for (int64_t e = 0; e < d; ++e) {
        double residual = 0;
        for (int64_t t = 0; t < kernel; ++t) {
          int64_t j = pad + i + t - kernel / 2;
          if (j >= 0 && j < P) residual += weight[h * kernel + t] * v[h][j][e];
        }
        out[i * D + h * d + e] = static_cast<float>(mixed[pad + i][e] + residual);
      }
  }
  return class_attention ? scores : out;
}

std::string describe(const Case& c, int64_t chunk_rows) {
  return "rows " + std::to_string(c.rows) + " count " + std::to_string(c.count) + " landmarks " +
         std::to_string(c.landmarks) + " chunks of " + (chunk_rows ? std::to_string(chunk_rows) : std::string("all"));
}

TEST(NystromAttention, ForwardMatchesCpuAndZeroesRowsPastTheSequence) {
  constexpr int kIterations = 6, kKernel = 33;
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {Case{17, 16, 8, 8, 7}, Case{17, 16, 8, 8, 16}, Case{5, 16, 8, 8, 1}, Case{10, 24, 2, 4, 9},
                          Case{50, 16, 2, 4, 37}})
      for (int64_t chunk_rows : {0, 3}) {
        SCOPED_TRACE(describe(c, chunk_rows) + (activations == DType::f16 ? " fp16" : " fp32"));
        NystromAttention attention(c.heads, c.landmarks, kIterations, kKernel, Output::values, chunk_rows);
        test::OpCheck check(test::context(), attention, {{1, c.rows, c.width}, {1}}, 5, {DType::f32, DType::u32}, {},
                            activations);
        check.inputs[1] = {static_cast<float>(c.count)};
        std::vector<float> expected = reference(c, check.inputs[0], check.tensors[0], check.tensors[1], kIterations, kKernel);
        test::expect_near(check.forward(), expected, activations == DType::f16 ? 1e-2 : 1e-4, "out");
      }
}

TEST(NystromAttention, ClassAttentionMatchesCpu) {
  for (const Case& c : {Case{17, 16, 8, 8, 7}, Case{10, 8, 2, 4, 9}})
    for (int64_t chunk_rows : {0, 4}) {
      SCOPED_TRACE(describe(c, chunk_rows));
      NystromAttention attention(c.heads, c.landmarks, 6, 33, Output::class_attention, chunk_rows);
      test::OpCheck check(test::context(), attention, {{1, c.rows, c.width}, {1}}, 7, {DType::f32, DType::u32});
      check.inputs[1] = {static_cast<float>(c.count)};
      std::vector<float> expected = reference(c, check.inputs[0], check.tensors[0], check.tensors[1], 6, 33, true);
      test::expect_near(check.forward(), expected, 1e-4, "scores");
      // Inference once its weights are loaded (Network::prepare): the same scores.
      test::expect_near(check.forward_prepared(), expected, 1e-4, "scores after prepare");
    }
}

TEST(NystromAttention, ClassTokenIsTheFirstRowOfTheValues) {
  for (const Case& c : {Case{17, 16, 8, 8, 7}, Case{10, 24, 2, 4, 9}}) {
    SCOPED_TRACE(describe(c, 4));
    NystromAttention attention(c.heads, c.landmarks, 6, 33, Output::class_token, 4);
    test::OpCheck check(test::context(), attention, {{1, c.rows, c.width}, {1}}, 8, {DType::f32, DType::u32});
    check.inputs[1] = {static_cast<float>(c.count)};
    std::vector<float> values = reference(c, check.inputs[0], check.tensors[0], check.tensors[1], 6, 33);
    test::expect_near(check.forward(), std::vector<float>(values.begin(), values.begin() + c.width), 1e-4, "class token");
  }
}

TEST(NystromAttention, BackwardMatchesFiniteDifferences) {
  for (auto [c, output, chunk_rows] : {std::tuple{Case{17, 16, 8, 8, 7}, Output::values, int64_t{5}},
                                       std::tuple{Case{10, 8, 2, 4, 9}, Output::values, int64_t{0}},
                                       std::tuple{Case{10, 8, 2, 4, 9}, Output::class_token, int64_t{3}}}) {
    SCOPED_TRACE(describe(c, chunk_rows) + (output == Output::class_token ? " class token" : ""));
    NystromAttention attention(c.heads, c.landmarks, 6, 33, output, chunk_rows);
    test::OpCheck check(test::context(), attention, {{1, c.rows, c.width}, {1}}, 6, {DType::f32, DType::u32});
    check.inputs[1] = {static_cast<float>(c.count)};
    check.expect_gradients_match(1e-2, 2e-2, 160);  // 160 elements of each tensor: a forward pass is ~100 dispatches
  }
}

// Kept from forward or computed again in backward, q, k, v and the pseudo-inverse's iterates are
// the same values: the same gradients to the bit, fp32 and fp16.
TEST(NystromAttention, KeptAndRecomputedBackwardsAgreeToTheBit) {
  for (DType activations : {DType::f32, DType::f16})
    for (Output output : {Output::values, Output::class_token}) {
      SCOPED_TRACE(std::string(output == Output::class_token ? "class token" : "values") +
                   (activations == DType::f16 ? ", fp16" : ", fp32"));
      const Case c{17, 16, 8, 8, 7};
      std::vector<std::vector<std::vector<float>>> gradients;
      for (bool recompute : {true, false}) {
        NystromAttention attention(c.heads, c.landmarks, 6, 33, output, 5, recompute);
        test::OpCheck check(test::context(), attention, {{1, c.rows, c.width}, {1}}, 6, {DType::f32, DType::u32}, {},
                            activations);
        check.inputs[1] = {static_cast<float>(c.count)};
        const int64_t outputs = output == Output::class_token ? c.width : c.rows * c.width;
        gradients.push_back(check.backward(test::random_values(static_cast<size_t>(outputs), 9)));
      }
      EXPECT_EQ(gradients[0], gradients[1]);
    }
}

TEST(NystromAttention, RejectsShapesItCannotSplitIntoHeads) {
  NystromAttention attention(8, 8, 6, 33);
  EXPECT_EQ(attention.infer({{1, 17, 16}, {1}}), (Shape{1, 17, 16}));
  EXPECT_EQ(NystromAttention(8, 8, 6, 33, Output::class_token).infer({{1, 17, 16}, {1}}), (Shape{1, 16}));
  EXPECT_THROW(attention.infer({{1, 17, 12}, {1}}), ShapeError);
  EXPECT_THROW(attention.infer({{2, 17, 16}, {1}}), ShapeError);
  EXPECT_THROW(attention.infer({{1, 17, 16}}), ShapeError);
}

}  // namespace
}  // namespace tessera
