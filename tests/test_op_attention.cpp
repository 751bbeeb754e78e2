// The fused multi-head self-attention against a CPU loop (scores, softmax and the value sum in
// double), fp32 and fp16, with the CPU's and a GPU's tiles, at sequence lengths that are no
// multiple of any tile: 261 (256 patches, a class token, 4 registers) and 1025; head sizes of
// 64 (ViT-B/L, UNI2-h, H-optimus) and 80 (Virchow2).
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/attention.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t batch, tokens, heads, head_dim;
};

// timm's Attention.forward without its projections: qkv [N, T, 3, H, hd] -> [N, T, H * hd].
std::vector<float> attention_reference(const std::vector<float>& qkv, const Case& c) {
  const int64_t width = c.heads * c.head_dim, row = 3 * width;
  std::vector<float> out(static_cast<size_t>(c.batch * c.tokens * width));
  std::vector<double> scores(static_cast<size_t>(c.tokens));
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  for (int64_t n = 0; n < c.batch; ++n)
    for (int64_t h = 0; h < c.heads; ++h) {
      const float* base = qkv.data() + n * c.tokens * row + h * c.head_dim;
      for (int64_t i = 0; i < c.tokens; ++i) {
        double largest = -INFINITY;
        for (int64_t j = 0; j < c.tokens; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.head_dim; ++d)
            dot += static_cast<double>(base[i * row + d]) * base[j * row + width + d];
          scores[static_cast<size_t>(j)] = dot * scale;
          largest = std::max(largest, dot * scale);
        }
        double total = 0;
        for (auto& s : scores) total += (s = std::exp(s - largest));
        for (int64_t d = 0; d < c.head_dim; ++d) {
          double sum = 0;
          for (int64_t j = 0; j < c.tokens; ++j) sum += scores[static_cast<size_t>(j)] * base[j * row + 2 * width + d];
          out[static_cast<size_t>((n * c.tokens + i) * width + h * c.head_dim + d)] = static_cast<float>(sum / total);
        }
      }
    }
  return out;
}

void expect_matches(const Case& c, DType activations) {
  Attention attention(c.heads);
  test::OpCheck check(test::context(), attention, {{c.batch, c.tokens, 3 * c.heads * c.head_dim}}, 11, {}, {},
                      activations);
  ASSERT_EQ(check.output_shape, (Shape{c.batch, c.tokens, c.heads * c.head_dim}));
  // Scores of a few units: a softmax neither flat nor one-hot, whose maximum moves between tiles.
  for (auto& x : check.inputs[0]) x *= 2.5f;
  if (activations == DType::f16) check.inputs[0] = from_half(to_half(check.inputs[0]));
  test::expect_near(check.forward(), attention_reference(check.inputs[0], c), test::forward_tolerance(activations),
                    "attention");
}

TEST(Attention, ForwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (DType activations : {DType::f32, DType::f16})
      for (const Case& c : {Case{2, 261, 3, 64}, Case{1, 261, 2, 80}, Case{2, 7, 2, 8}, Case{3, 1, 1, 4}}) {
        SCOPED_TRACE(target.device_type + " tiles, " + (activations == DType::f16 ? "fp16" : "fp32") + ", " +
                     std::to_string(c.tokens) + " tokens, head " + std::to_string(c.head_dim));
        test::TileTargetScope scope(test::context(), target);
        expect_matches(c, activations);
      }
}

TEST(Attention, LongSequenceMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (DType activations : {DType::f32, DType::f16}) {
      SCOPED_TRACE(target.device_type + " tiles, " + (activations == DType::f16 ? "fp16" : "fp32"));
      test::TileTargetScope scope(test::context(), target);
      expect_matches(Case{1, 1025, 2, 64}, activations);
    }
}

// A softmax dominated by one key far along the sequence: the running maximum must rescale what
// earlier tiles summed (exp(s - m) of a stale m would overflow or vanish).
TEST(Attention, RescalesWhenALaterTileHoldsTheMaximum) {
  Case c{1, 100, 1, 8};
  Attention attention(c.heads);
  test::OpCheck check(test::context(), attention, {{c.batch, c.tokens, 24}}, 12);
  auto& qkv = check.inputs[0];
  for (int64_t d = 0; d < 8; ++d) {
    for (int64_t t = 0; t < c.tokens; ++t) qkv[static_cast<size_t>(t * 24 + d)] = 3.0f;  // queries
    qkv[static_cast<size_t>(97 * 24 + 8 + d)] = 40.0f;                                   // key 97
  }
  test::expect_near(check.forward(), attention_reference(qkv, c), 1e-5, "attention");
}

TEST(Attention, RefusesShapesThatAreNotPackedHeads) {
  Attention attention(4);
  EXPECT_THROW(attention.infer({{2, 10, 3 * 4 * 8 + 1}}), ShapeError);
  EXPECT_THROW(attention.infer({{20, 3 * 4 * 8}}), ShapeError);
  EXPECT_THROW(attention.infer({{2, 10, 3 * 4 * 512}}), ShapeError);
}

}  // namespace
}  // namespace tessera
