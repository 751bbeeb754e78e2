// Swin's window attention and patch-merging gather against CPU loops in double written from timm
// 0.5.4's swin_transformer.py as it runs them (huggingface/pytorch-image-models at v0.5.4, the
// fork CTransPath's ctran.py builds on: Xiyue-Wang/TransPath and mahmoodlab/TRIDENT's
// model_zoo/ctranspath/ctran.py): torch.roll by -shift, window_partition, the relative position
// index and the img_mask regions built as SwinTransformerBlock.__init__ builds them, the -100 mask,
// softmax, window_reverse and the roll back; PatchMerging's x0, x1, x2, x3. Unlike the kernel, the
// reference materialises the rolled grid, the windows, the index and the mask. fp32 and fp16, at
// CTransPath's first stage (a 56 x 56 grid, windows of 7, shift 3, 3 heads of 32), its last (7 x 7,
// one window, no shift) and at sizes that are no multiple of anything (heads of 5, a 6 x 9 grid).
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "compute/ops/patch_merge.h"
#include "compute/ops/window_attention.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

using Geometry = WindowAttention::Geometry;

// timm's relative_position_index: for windows of w, the (w^2, w^2) table of
// (qy - ky + w - 1) * (2w - 1) + (qx - kx + w - 1), from the coordinate grids as __init__ builds it.
std::vector<int64_t> relative_position_index(int64_t w) {
  std::vector<int64_t> index(static_cast<size_t>(w * w * w * w));
  for (int64_t a = 0; a < w * w; ++a)
    for (int64_t b = 0; b < w * w; ++b) {
      int64_t dy = a / w - b / w + w - 1, dx = a % w - b % w + w - 1;
      index[static_cast<size_t>(a * w * w + b)] = dy * (2 * w - 1) + dx;
    }
  return index;
}

// timm's img_mask: each position of the rolled grid numbered by its (h slice, w slice) region,
// the slices (0, -w), (-w, -shift), (-shift, None) as Python reads them.
std::vector<int64_t> region_labels(int64_t height, int64_t width, int64_t w, int64_t shift) {
  auto slice_of = [&](int64_t i, int64_t size) { return i < size - w ? 0 : i < size - shift ? 1 : 2; };
  std::vector<int64_t> labels(static_cast<size_t>(height * width));
  for (int64_t r = 0; r < height; ++r)
    for (int64_t c = 0; c < width; ++c) labels[static_cast<size_t>(r * width + c)] = slice_of(r, height) * 3 + slice_of(c, width);
  return labels;
}

std::vector<float> window_attention_reference(const std::vector<float>& qkv, const std::vector<float>& table,
                                              int64_t batch, const Geometry& g, int64_t head_dim) {
  const int64_t H = g.grid_height, W = g.grid_width, w = g.window, C = g.heads * head_dim, area = w * w;
  const std::vector<int64_t> index = relative_position_index(w), labels = region_labels(H, W, w, g.shift);
  std::vector<float> out(static_cast<size_t>(batch * H * W * C));
  std::vector<double> scores(static_cast<size_t>(area));
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t wy = 0; wy < H / w; ++wy)
      for (int64_t wx = 0; wx < W / w; ++wx) {
        // window_partition of the grid rolled by -shift: rolled[i][j] = x[(i + shift) % H][(j + shift) % W].
        std::vector<int64_t> source(static_cast<size_t>(area)), rolled(static_cast<size_t>(area));
        for (int64_t a = 0; a < area; ++a) {
          int64_t i = wy * w + a / w, j = wx * w + a % w;
          rolled[static_cast<size_t>(a)] = i * W + j;
          source[static_cast<size_t>(a)] = ((i + g.shift) % H) * W + (j + g.shift) % W;
        }
        for (int64_t h = 0; h < g.heads; ++h)
          for (int64_t a = 0; a < area; ++a) {
            auto at = [&](int64_t token, int64_t part, int64_t d) {
              return static_cast<double>(qkv[static_cast<size_t>(((n * H * W + token) * 3 + part) * C + h * head_dim + d)]);
            };
            double largest = -INFINITY, total = 0;
            for (int64_t b = 0; b < area; ++b) {
              double dot = 0;
              for (int64_t d = 0; d < head_dim; ++d) dot += at(source[a], 0, d) * at(source[b], 1, d);
              double score = dot / std::sqrt(static_cast<double>(head_dim)) +
                             table[static_cast<size_t>(index[static_cast<size_t>(a * area + b)] * g.heads + h)];
              if (g.shift > 0 && labels[static_cast<size_t>(rolled[a])] != labels[static_cast<size_t>(rolled[b])])
                score += -100.0;
              scores[static_cast<size_t>(b)] = score;
              largest = std::max(largest, score);
            }
            for (auto& s : scores) total += (s = std::exp(s - largest));
            // window_reverse, then the roll by +shift: the output lands where the query came from.
            for (int64_t d = 0; d < head_dim; ++d) {
              double sum = 0;
              for (int64_t b = 0; b < area; ++b) sum += scores[static_cast<size_t>(b)] * at(source[b], 2, d);
              out[static_cast<size_t>((n * H * W + source[a]) * C + h * head_dim + d)] = static_cast<float>(sum / total);
            }
          }
      }
  return out;
}

void expect_window_attention_matches(int64_t batch, const Geometry& g, int64_t head_dim, DType activations) {
  WindowAttention attention(g);
  const int64_t tokens = g.grid_height * g.grid_width, width = g.heads * head_dim;
  test::OpCheck check(test::context(), attention, {{batch, tokens, 3 * width}}, 17, {}, {}, activations);
  ASSERT_EQ(check.output_shape, (Shape{batch, tokens, width}));
  ASSERT_EQ(check.specs[0].shape, (Shape{(2 * g.window - 1) * (2 * g.window - 1), g.heads}));
  // Scores of a few units: a softmax neither flat nor one-hot, the bias and the mask both felt.
  const float spread = 2.5f / std::pow(static_cast<float>(head_dim), 0.25f);
  for (auto& v : check.inputs[0]) v *= spread;
  if (activations == DType::f16) check.inputs[0] = from_half(to_half(check.inputs[0]));
  test::expect_near(check.forward(), window_attention_reference(check.inputs[0], check.tensors[0], batch, g, head_dim),
                    test::forward_tolerance(activations), "window_attention");
}

const char* precision(DType activations) { return activations == DType::f16 ? "fp16" : "fp32"; }

// CTransPath's first stage: 56 x 56 tokens of 96 features, windows of 7, 3 heads of 32; every
// second block shifted by 3.
TEST(WindowAttention, SwinFirstStageOn56x56MatchesTimm) {
  for (DType activations : {DType::f32, DType::f16})
    for (int64_t shift : {0, 3}) {
      SCOPED_TRACE(std::string(precision(activations)) + ", shift " + std::to_string(shift));
      expect_window_attention_matches(1, Geometry{3, 7, shift, 56, 56}, 32, activations);
    }
}

// Odd sizes: a 6 x 9 grid of windows of 3 (two by three windows), shifted by 1 and 2, heads of 5;
// CTransPath's last stage (7 x 7: one window, timm sets the shift to 0); one token.
TEST(WindowAttention, OddSizesMatchTimm) {
  struct Case {
    int64_t batch;
    Geometry geometry;
    int64_t head_dim;
  };
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {Case{2, {2, 3, 1, 6, 9}, 5}, Case{3, {3, 3, 2, 9, 6}, 7}, Case{2, {24, 7, 0, 7, 7}, 32},
                          Case{1, {1, 1, 0, 1, 1}, 3}}) {
      SCOPED_TRACE(std::string(precision(activations)) + ", grid " + std::to_string(c.geometry.grid_height) + "x" +
                   std::to_string(c.geometry.grid_width) + ", shift " + std::to_string(c.geometry.shift));
      expect_window_attention_matches(c.batch, c.geometry, c.head_dim, activations);
    }
}

// timm 0.5.4 neither pads nor crops: window_partition's view fails on a grid that is not a
// multiple of the window, and its block asserts 0 <= shift < window.
TEST(WindowAttention, RefusesWhatTimmRefuses) {
  WindowAttention uneven(Geometry{3, 7, 3, 10, 10});
  EXPECT_THROW(uneven.infer({{1, 100, 288}}), ShapeError);
  WindowAttention wrong_tokens(Geometry{3, 7, 3, 14, 14});
  EXPECT_THROW(wrong_tokens.infer({{1, 195, 288}}), ShapeError);
  EXPECT_THROW(wrong_tokens.infer({{1, 196, 280}}), ShapeError);
  nlohmann::json layer = {{"name", "attn"}, {"type", "window_attention"}, {"heads", 3}, {"window", 7},
                          {"shift", 7}, {"grid_height", 14}, {"grid_width", 14}};
  EXPECT_THROW(make_op(LayerConfig(layer)), ModelError);
}

// x0 (even row, even column), x1 (odd, even), x2 (even, odd), x3 (odd, odd), concatenated.
std::vector<float> patch_merge_reference(const std::vector<float>& x, int64_t batch, int64_t H, int64_t W, int64_t C) {
  std::vector<float> y;
  const int64_t offsets[4][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}};
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t r = 0; r < H; r += 2)
      for (int64_t c = 0; c < W; c += 2)
        for (auto [dy, dx] : offsets)
          for (int64_t k = 0; k < C; ++k) y.push_back(x[static_cast<size_t>(((n * H + r + dy) * W + c + dx) * C + k)]);
  return y;
}

TEST(PatchMerge, GathersTimmsOrder) {
  struct Case {
    int64_t batch, height, width, channels;
  };
  for (DType activations : {DType::f32, DType::f16})
    for (const Case& c : {Case{1, 56, 56, 96}, Case{2, 4, 6, 5}, Case{3, 2, 2, 1}}) {
      SCOPED_TRACE(std::string(precision(activations)) + ", " + std::to_string(c.height) + "x" + std::to_string(c.width));
      PatchMerge merge(c.height, c.width);
      test::OpCheck check(test::context(), merge, {{c.batch, c.height * c.width, c.channels}}, 5, {}, {}, activations);
      ASSERT_EQ(check.output_shape, (Shape{c.batch, c.height / 2 * (c.width / 2), 4 * c.channels}));
      test::expect_near(check.forward(), patch_merge_reference(check.inputs[0], c.batch, c.height, c.width, c.channels),
                        0, "patch_merge");
    }
  PatchMerge odd(5, 4);
  EXPECT_THROW(odd.infer({{1, 20, 8}}), ShapeError);
  PatchMerge even(4, 4);
  EXPECT_THROW(even.infer({{1, 15, 8}}), ShapeError);
}

}  // namespace
}  // namespace tessera
