// vit_tokens (class and register tokens, the learned position embedding, resampled where the
// patch grid differs) and token_pool against CPU loops, fp32 and fp16; token_pool's class-token
// backward (TransMIL trains through it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "compute/ops/vit_tokens.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

using Position = VitTokens::Position;

// The taps and weights of F.interpolate(mode='bicubic', antialias=True, align_corners=False)
// along one axis, as PyTorch's upsample kernel computes them (PIL's filter, a = -0.5).
std::vector<std::vector<std::pair<int64_t, double>>> antialiased_bicubic(int64_t in, int64_t out) {
  auto filter = [](double x) {
    const double a = -0.5;
    x = std::abs(x);
    if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
  };
  double scale = static_cast<double>(in) / static_cast<double>(out);
  double support = scale >= 1 ? 2 * scale : 2, inverse = scale >= 1 ? 1 / scale : 1;
  std::vector<std::vector<std::pair<int64_t, double>>> taps(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double center = scale * (static_cast<double>(o) + 0.5), total = 0;
    auto first = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    auto last = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    for (int64_t i = first; i < last; ++i) {
      double w = filter((static_cast<double>(i) - center + 0.5) * inverse);
      taps[static_cast<size_t>(o)].push_back({i, w});
      total += w;
    }
    for (auto& [i, w] : taps[static_cast<size_t>(o)]) w /= total;
  }
  return taps;
}

// The taps and weights of F.interpolate(mode='bicubic', align_corners=False, size=out) without
// antialiasing, as PyTorch's upsample_bicubic2d computes them: four taps around
// scale * (o + 0.5) - 0.5, cubic convolution with A = -0.75, indices clamped to the edges. With
// scale_factor=(out + 0.1) / in instead (DINO's interpolate_pos_encoding: by_scale_factor),
// PyTorch takes the scale as its inverse, in / (out + 0.1), not in / out.
std::vector<std::vector<std::pair<int64_t, double>>> plain_bicubic(int64_t in, int64_t out, bool by_scale_factor) {
  const double A = -0.75;
  auto near = [&](double x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };    // |x| <= 1
  auto far = [&](double x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };  // 1 < |x| < 2
  double scale = static_cast<double>(in) / (static_cast<double>(out) + (by_scale_factor ? 0.1 : 0.0));
  std::vector<std::vector<std::pair<int64_t, double>>> taps(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double source = scale * (static_cast<double>(o) + 0.5) - 0.5, floor = std::floor(source), t = source - floor;
    auto index = static_cast<int64_t>(floor);
    const double weights[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
    for (int64_t k = 0; k < 4; ++k)
      taps[static_cast<size_t>(o)].push_back({std::clamp<int64_t>(index - 1 + k, 0, in - 1), weights[k]});
  }
  return taps;
}

// The resampled table [rows, D] whose first `covered` rows are prefix tokens: timm's
// resample_abs_pos_embed, Hugging Face Dinov2's plain bicubic, or DINO's by scale factor.
std::vector<double> resample(const std::vector<float>& table, int64_t covered, int64_t width,
                             std::array<int64_t, 2> from, std::array<int64_t, 2> to, VitTokens::Resample how) {
  if (from == to) return {table.begin(), table.end()};
  auto taps = [how](int64_t in, int64_t out) {
    if (how == VitTokens::Resample::timm_antialiased) return antialiased_bicubic(in, out);
    return plain_bicubic(in, out, how == VitTokens::Resample::bicubic_by_scale_factor);
  };
  auto rows = taps(from[0], to[0]), columns = taps(from[1], to[1]);
  std::vector<double> out(static_cast<size_t>((covered + to[0] * to[1]) * width));
  for (int64_t i = 0; i < covered * width; ++i) out[static_cast<size_t>(i)] = table[static_cast<size_t>(i)];
  for (int64_t y = 0; y < to[0]; ++y)
    for (int64_t x = 0; x < to[1]; ++x)
      for (int64_t d = 0; d < width; ++d) {
        double sum = 0;
        for (auto [iy, wy] : rows[static_cast<size_t>(y)])
          for (auto [ix, wx] : columns[static_cast<size_t>(x)])
            sum += wy * wx * table[static_cast<size_t>((covered + iy * from[1] + ix) * width + d)];
        out[static_cast<size_t>((covered + y * to[1] + x) * width + d)] = sum;
      }
  return out;
}

struct Case {
  bool class_token;
  int64_t registers;
  Position position;
  std::array<int64_t, 2> learned, input;  // patch grids
  VitTokens::Resample resample = VitTokens::Resample::timm_antialiased;
};

void expect_tokens_match(const Case& c, DType activations, DType weights = DType::f32) {
  const int64_t batch = 2, width = 7, prefix = (c.class_token ? 1 : 0) + c.registers;
  const int64_t patches = c.input[0] * c.input[1], tokens = prefix + patches;
  VitTokens op(c.class_token, c.registers, c.position, c.learned, c.resample);
  test::OpCheck check(test::context(), op, {{batch, width, c.input[0], c.input[1]}}, 21, {}, {}, activations, weights);
  ASSERT_EQ(check.output_shape, (Shape{batch, tokens, width}));
  size_t next = 0;
  const std::vector<float>* cls = c.class_token ? &check.tensors[next++] : nullptr;
  const std::vector<float>* reg = c.registers ? &check.tensors[next++] : nullptr;
  const int64_t covered = c.position == Position::tokens ? prefix : 0;
  std::vector<double> position;
  if (c.position != Position::none) {
    ASSERT_EQ(check.specs[next].name, "pos_embed");
    ASSERT_EQ(check.specs[next].shape, (Shape{1, covered + c.learned[0] * c.learned[1], width}));
    ASSERT_EQ(check.specs[next].dtype, weights);
    position = resample(check.tensors[next], covered, width, c.learned, c.input, c.resample);
  }
  const auto& x = check.inputs[0];
  std::vector<float> expected(static_cast<size_t>(batch * tokens * width));
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t d = 0; d < width; ++d) {
        double value = c.class_token && t == 0 ? (*cls)[static_cast<size_t>(d)]
                       : t < prefix            ? (*reg)[static_cast<size_t>((t - (c.class_token ? 1 : 0)) * width + d)]
                                               : x[static_cast<size_t>((n * width + d) * patches + t - prefix)];
        if (c.position == Position::tokens) value += position[static_cast<size_t>(t * width + d)];
        if (c.position == Position::patches && t >= prefix)
          value += position[static_cast<size_t>((t - prefix) * width + d)];
        expected[static_cast<size_t>((n * tokens + t) * width + d)] = static_cast<float>(value);
      }
  test::expect_near(check.forward(), expected, test::forward_tolerance(activations), "tokens");
}

TEST(VitTokens, ForwardMatchesCpu) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {
             Case{true, 4, Position::tokens, {16, 16}, {16, 16}},   // 261 tokens, Virchow2's rule
             Case{true, 4, Position::patches, {16, 16}, {16, 16}},  // H-optimus-0's (no_embed_class)
             Case{true, 0, Position::tokens, {14, 14}, {14, 14}},   // ViT-B/16, UNI
             Case{false, 0, Position::none, {3, 5}, {3, 5}},
             Case{false, 2, Position::patches, {2, 3}, {2, 3}},
         }) {
      SCOPED_TRACE((activations == DType::f16 ? "fp16, " : "fp32, ") + std::to_string(c.registers) + " registers");
      expect_tokens_match(c, activations);
    }
}

TEST(VitTokens, ResamplesThePositionEmbeddingAsTimm) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {
             Case{true, 0, Position::tokens, {14, 14}, {32, 32}},  // 224 -> 512 px at 16: 1025 tokens
             Case{true, 8, Position::patches, {16, 16}, {9, 12}},  // shrunk, and not square
             Case{true, 4, Position::tokens, {4, 4}, {5, 3}},
         }) {
      SCOPED_TRACE((activations == DType::f16 ? "fp16, " : "fp32, ") + std::to_string(c.input[0]) + "x" +
                   std::to_string(c.input[1]));
      expect_tokens_match(c, activations);
    }
}

TEST(VitTokens, ResamplesThePositionEmbeddingAsHuggingFacesDinov2) {
  using Resample = VitTokens::Resample;
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {
             Case{true, 0, Position::tokens, {37, 37}, {16, 16}, Resample::bicubic},  // 518 -> 224 px at 14
             Case{true, 4, Position::tokens, {5, 7}, {11, 3}, Resample::bicubic},     // grown one way, shrunk the other
         }) {
      SCOPED_TRACE((activations == DType::f16 ? "fp16, " : "fp32, ") + std::to_string(c.input[0]) + "x" +
                   std::to_string(c.input[1]));
      expect_tokens_match(c, activations);
    }
}

// CONCH v1.5's trunk: learned on 14x14 (224 pixels), run at 448 pixels (28x28, 785 tokens), as DINO's
// interpolate_pos_encoding; and grids that shrink, or grow by a scale that is not whole.
TEST(VitTokens, ResamplesThePositionEmbeddingByScaleFactorAsDino) {
  const auto by_scale_factor = VitTokens::Resample::bicubic_by_scale_factor;
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {
             Case{true, 0, Position::tokens, {14, 14}, {28, 28}, by_scale_factor},
             Case{true, 0, Position::tokens, {16, 16}, {9, 9}, by_scale_factor},
             Case{true, 4, Position::patches, {5, 5}, {13, 13}, by_scale_factor},
         }) {
      SCOPED_TRACE((activations == DType::f16 ? "fp16, " : "fp32, ") + std::to_string(c.input[0]) + "x" +
                   std::to_string(c.input[1]));
      expect_tokens_match(c, activations);
    }
}

// --weights fp16: the position embedding stored fp16 (read as it is, and resampled), the class
// and register tokens float; the reference takes the same fp16-rounded embedding.
TEST(VitTokens, Fp16PositionEmbeddingMatchesCpu) {
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {
             Case{true, 4, Position::tokens, {16, 16}, {16, 16}},
             Case{true, 4, Position::patches, {16, 16}, {9, 12}},
             Case{true, 0, Position::tokens, {14, 14}, {15, 13}},
         }) {
      SCOPED_TRACE((activations == DType::f16 ? "fp16, " : "fp32, ") + std::to_string(c.input[0]) + "x" +
                   std::to_string(c.input[1]));
      expect_tokens_match(c, activations, DType::f16);
    }
}

TEST(VitTokens, ParametersAreTheModelsOwn) {
  VitTokens op(true, 4, Position::patches, {16, 16});
  op.infer({{1, 32, 16, 16}});
  std::vector<std::string> names;
  for (auto& spec : op.tensors()) names.push_back(tensor_name("tokens", spec));
  EXPECT_EQ(names, (std::vector<std::string>{"cls_token", "reg_token", "pos_embed"}));
}

TEST(TokenPool, ForwardMatchesCpu) {
  const int64_t batch = 3, width = 19, prefix = 5;
  for (int64_t tokens : {261, 1025})
    for (DType activations : {DType::f32, DType::f16})
      for (auto mode :
           {TokenPool::Mode::class_token, TokenPool::Mode::class_token_and_patch_mean, TokenPool::Mode::patch_mean}) {
        TokenPool pool(mode, prefix);
        test::OpCheck check(test::context(), pool, {{batch, tokens, width}}, 31, {}, {}, activations);
        const auto& x = check.inputs[0];
        std::vector<float> expected;
        for (int64_t n = 0; n < batch; ++n) {
          const float* first = x.data() + n * tokens * width;
          if (mode != TokenPool::Mode::patch_mean) expected.insert(expected.end(), first, first + width);
          if (mode == TokenPool::Mode::class_token) continue;
          for (int64_t d = 0; d < width; ++d) {
            double sum = 0;
            for (int64_t t = prefix; t < tokens; ++t) sum += first[t * width + d];
            expected.push_back(static_cast<float>(sum / static_cast<double>(tokens - prefix)));
          }
        }
        ASSERT_EQ(check.output_shape.back(), mode == TokenPool::Mode::class_token_and_patch_mean ? 2 * width : width);
        test::expect_near(check.forward(), expected, test::forward_tolerance(activations), "token_pool");
      }
}

TEST(TokenPool, ClassTokenBackwardTakesTokenZerosGradient) {
  const int64_t batch = 2, tokens = 6, width = 7;
  for (DType activations : {DType::f32, DType::f16}) {
    SCOPED_TRACE(activations == DType::f16 ? "fp16" : "fp32");
    TokenPool pool(TokenPool::Mode::class_token, 1);
    test::OpCheck check(test::context(), pool, {{batch, tokens, width}}, 33, {}, {}, activations);
    auto dy = from_half(to_half(test::random_values(static_cast<size_t>(batch * width), 34)));
    std::vector<float> expected(static_cast<size_t>(batch * tokens * width), 0.0f);
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t d = 0; d < width; ++d) expected[n * tokens * width + d] = dy[n * width + d];
    auto grads = check.backward(dy);
    ASSERT_EQ(grads.size(), 1u);
    test::expect_near(grads[0], expected, 0, "dx");  // copies and zeros: exact
  }
  TokenPool pool(TokenPool::Mode::class_token, 5);
  test::OpCheck check(test::context(), pool, {{batch, tokens, width}}, 35);
  check.expect_gradients_match();
}

TEST(TokenPool, OnlyTheClassTokenTrains) {
  EXPECT_TRUE(TokenPool(TokenPool::Mode::class_token, 1).has_backward());
  EXPECT_FALSE(TokenPool(TokenPool::Mode::patch_mean, 1).has_backward());
  EXPECT_FALSE(TokenPool(TokenPool::Mode::class_token_and_patch_mean, 1).has_backward());
}

}  // namespace
}  // namespace tessera
