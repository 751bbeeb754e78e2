// attentional_pool (CONCH v1.5's attn_pool_contrast) against a CPU loop in double written from
// TRIDENT's conchv1_5.py AttentionalPooler: ln_k over the tokens, ln_q over the learned queries,
// the bias-free to_q, to_kv and to_out, softmax(q k^T / sqrt(head)) v per head. fp32 and fp16, with
// the CPU's and a GPU's tiles, over CONCH's 785 tokens at its real widths (1024 -> 768, 8 heads of
// 96) and at sizes that are no multiple of any tile.
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/attentional_pool.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t batch, tokens, context, width, heads, queries;
};

std::vector<double> layer_norm(const float* x, int64_t rows, int64_t width, const std::vector<float>& weight,
                               const std::vector<float>& bias, double eps) {
  std::vector<double> y(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, variance = 0;
    for (int64_t i = 0; i < width; ++i) mean += x[r * width + i];
    mean /= static_cast<double>(width);
    for (int64_t i = 0; i < width; ++i) variance += (x[r * width + i] - mean) * (x[r * width + i] - mean);
    double inverse_std = 1 / std::sqrt(variance / static_cast<double>(width) + eps);
    for (int64_t i = 0; i < width; ++i)
      y[static_cast<size_t>(r * width + i)] = (x[r * width + i] - mean) * inverse_std * weight[static_cast<size_t>(i)] +
                                              bias[static_cast<size_t>(i)];
  }
  return y;
}

// y [rows, out] = x [rows, in] weight^T, nn.Linear without bias.
std::vector<double> project(const std::vector<double>& x, int64_t rows, int64_t in, const std::vector<float>& weight,
                            int64_t out) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0;
      for (int64_t i = 0; i < in; ++i) sum += x[static_cast<size_t>(r * in + i)] * weight[static_cast<size_t>(o * in + i)];
      y[static_cast<size_t>(r * out + o)] = sum;
    }
  return y;
}

// The parameters in tensors()'s order: query, ln_k.{weight,bias}, ln_q.{weight,bias}, to_q, to_kv, to_out.
std::vector<float> pool_reference(const std::vector<float>& x, const std::vector<std::vector<float>>& p, const Case& c) {
  const int64_t rows = c.batch * c.tokens, head = c.width / c.heads;
  std::vector<double> keys = project(layer_norm(x.data(), rows, c.context, p[1], p[2], 1e-5), rows, c.context, p[6],
                                     2 * c.width);
  std::vector<double> q = project(layer_norm(p[0].data(), c.queries, c.width, p[3], p[4], 1e-5), c.queries, c.width,
                                  p[5], c.width);
  std::vector<double> attended(static_cast<size_t>(c.batch * c.queries * c.width)), scores(static_cast<size_t>(c.tokens));
  for (int64_t n = 0; n < c.batch; ++n)
    for (int64_t i = 0; i < c.queries; ++i)
      for (int64_t h = 0; h < c.heads; ++h) {
        double largest = -INFINITY, total = 0;
        for (int64_t j = 0; j < c.tokens; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < head; ++d)
            dot += q[static_cast<size_t>(i * c.width + h * head + d)] *
                   keys[static_cast<size_t>((n * c.tokens + j) * 2 * c.width + h * head + d)];
          scores[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(head));
          largest = std::max(largest, scores[static_cast<size_t>(j)]);
        }
        for (auto& s : scores) total += (s = std::exp(s - largest));
        for (int64_t d = 0; d < head; ++d) {
          double sum = 0;
          for (int64_t j = 0; j < c.tokens; ++j)
            sum += scores[static_cast<size_t>(j)] *
                   keys[static_cast<size_t>((n * c.tokens + j) * 2 * c.width + c.width + h * head + d)];
          attended[static_cast<size_t>((n * c.queries + i) * c.width + h * head + d)] = sum / total;
        }
      }
  std::vector<double> out = project(attended, c.batch * c.queries, c.width, p[7], c.width);
  return {out.begin(), out.end()};
}

void expect_matches(const Case& c, DType activations) {
  AttentionalPool pool(c.width, c.heads, c.queries, 1e-5f);
  test::OpCheck check(test::context(), pool, {{c.batch, c.tokens, c.context}}, 31, {}, {}, activations);
  const Shape expected_shape = c.queries == 1 ? Shape{c.batch, c.width} : Shape{c.batch, c.queries, c.width};
  ASSERT_EQ(check.output_shape, expected_shape);
  ASSERT_EQ(check.specs[6].name, "to_kv.weight");
  ASSERT_EQ(check.specs[6].shape, (Shape{2 * c.width, c.context}));
  // Projections of unit scale: scores of a few units, a softmax neither flat nor one-hot.
  for (size_t s : {5, 6, 7}) {
    float scale = 1.7f / std::sqrt(static_cast<float>(check.specs[s].shape[1]));
    for (auto& w : check.tensors[s]) w *= scale;
  }
  for (auto& v : check.inputs[0]) v = 3 * v + 0.5f;  // LayerNorm removes a mean and a scale
  if (activations == DType::f16) check.inputs[0] = from_half(to_half(check.inputs[0]));
  std::vector<std::vector<float>> parameters(check.tensors.begin(), check.tensors.begin() + 8);
  test::expect_near(check.forward(), pool_reference(check.inputs[0], parameters, c),
                    test::forward_tolerance(activations), "attentional_pool");
}

TEST(AttentionalPool, ForwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (DType activations : {DType::f32, DType::f16})
      for (const Case& c : {Case{2, 37, 40, 24, 3, 1}, Case{3, 5, 12, 18, 2, 3}, Case{1, 1, 7, 4, 1, 1}}) {
        SCOPED_TRACE(target.device_type + " tiles, " + (activations == DType::f16 ? "fp16, " : "fp32, ") +
                     std::to_string(c.tokens) + " tokens, " + std::to_string(c.queries) + " queries");
        test::TileTargetScope scope(test::context(), target);
        expect_matches(c, activations);
      }
}

// CONCH v1.5's pooler over ViT-L/16's 785 tokens at 448 pixels: 1024 -> 768, 8 heads of 96.
TEST(AttentionalPool, ConchsPoolerOver785TokensMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (DType activations : {DType::f32, DType::f16}) {
      SCOPED_TRACE(target.device_type + " tiles, " + (activations == DType::f16 ? "fp16" : "fp32"));
      test::TileTargetScope scope(test::context(), target);
      expect_matches(Case{1, 785, 1024, 768, 8, 1}, activations);
    }
}

TEST(AttentionalPool, ParametersCarryConchsNames) {
  AttentionalPool pool(768, 8, 1, 1e-5f);
  pool.infer({{1, 785, 1024}});
  std::vector<std::string> names;
  for (auto& spec : pool.tensors())
    if (in_checkpoint(spec.role)) names.push_back(tensor_name("attn_pool_contrast", spec));
  EXPECT_EQ(names, (std::vector<std::string>{"attn_pool_contrast.query", "attn_pool_contrast.ln_k.weight",
                                             "attn_pool_contrast.ln_k.bias", "attn_pool_contrast.ln_q.weight",
                                             "attn_pool_contrast.ln_q.bias", "attn_pool_contrast.to_q.weight",
                                             "attn_pool_contrast.to_kv.weight", "attn_pool_contrast.to_out.weight"}));
  EXPECT_THROW(pool.infer({{1, 1024}}), ShapeError);
}

}  // namespace
}  // namespace tessera
