// conv2d against plain CPU loops (forward and both backward passes) and central differences.
#include <gtest/gtest.h>

#include "compute/ops/conv2d.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t batch, channels, height, width, out_channels, kernel_h, kernel_w, stride, padding;
  bool bias;
};

Conv2d make(const Case& c) { return Conv2d(c.out_channels, c.kernel_h, c.kernel_w, c.stride, c.padding, c.bias); }

// Calls visit(x index, weight index, y index) for every multiply of the convolution.
template <class Visit>
void for_each_tap(const Case& c, Visit visit) {
  int64_t oh_count = (c.height + 2 * c.padding - c.kernel_h) / c.stride + 1;
  int64_t ow_count = (c.width + 2 * c.padding - c.kernel_w) / c.stride + 1;
  for (int64_t n = 0; n < c.batch; ++n)
    for (int64_t o = 0; o < c.out_channels; ++o)
      for (int64_t oh = 0; oh < oh_count; ++oh)
        for (int64_t ow = 0; ow < ow_count; ++ow)
          for (int64_t ch = 0; ch < c.channels; ++ch)
            for (int64_t kh = 0; kh < c.kernel_h; ++kh)
              for (int64_t kw = 0; kw < c.kernel_w; ++kw) {
                int64_t ih = oh * c.stride - c.padding + kh, iw = ow * c.stride - c.padding + kw;
                if (ih < 0 || ih >= c.height || iw < 0 || iw >= c.width) continue;
                visit(((n * c.channels + ch) * c.height + ih) * c.width + iw,
                      ((o * c.channels + ch) * c.kernel_h + kh) * c.kernel_w + kw,
                      ((n * c.out_channels + o) * oh_count + oh) * ow_count + ow);
              }
}

std::vector<float> cpu_forward(const Case& c, const test::OpCheck& check) {
  const auto& x = check.inputs[0];
  const auto& weight = check.tensors[0];
  std::vector<double> y(static_cast<size_t>(element_count(check.output_shape)), 0.0);
  for_each_tap(c, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += static_cast<double>(x[xi]) * weight[wi]; });
  int64_t pixels = check.output_shape[2] * check.output_shape[3];
  if (c.bias)
    for (size_t i = 0; i < y.size(); ++i) y[i] += check.tensors[1][i / pixels % c.out_channels];
  return std::vector<float>(y.begin(), y.end());
}

// In fp16 (activations and their gradients stored fp16, sums float) the CPU reference takes the
// same fp16 values, and what differs is the rounding of the stored results: 2^-11 relative.
// A reduction of thousands of float sums rounds ~sqrt(steps) times more: `scale` widens it.
double tolerance(DType activations, double scale = 1) {
  return (activations == DType::f16 ? 1.0 / 1024 : 1e-4) * scale;
}

void expect_forward_matches(const Case& c, DType activations = DType::f32, double scale = 1,
                            DType weights = DType::f32) {
  Conv2d conv = make(c);
  test::OpCheck check(test::context(), conv, {{c.batch, c.channels, c.height, c.width}}, 1, {}, {}, activations,
                      weights);
  test::expect_near(check.forward(), cpu_forward(c, check), tolerance(activations, scale), "y");
}

// dx, dweight and dbias from the device against the CPU's, for one upstream gradient.
void expect_backward_matches(const Case& c, DType activations = DType::f32, double scale = 1) {
  Conv2d conv = make(c);
  test::OpCheck check(test::context(), conv, {{c.batch, c.channels, c.height, c.width}}, 1, {}, {}, activations);
  auto dy = test::random_values(static_cast<size_t>(element_count(check.output_shape)), 5);
  if (activations == DType::f16) dy = from_half(to_half(dy));
  auto grads = check.backward(dy);
  const auto& x = check.inputs[0];
  const auto& weight = check.tensors[0];
  std::vector<double> dx(x.size(), 0.0), dweight(weight.size(), 0.0), dbias(static_cast<size_t>(c.out_channels), 0.0);
  for_each_tap(c, [&](int64_t xi, int64_t wi, int64_t yi) {
    dx[xi] += static_cast<double>(dy[yi]) * weight[wi];
    dweight[wi] += static_cast<double>(dy[yi]) * x[xi];
  });
  int64_t pixels = check.output_shape[2] * check.output_shape[3];
  for (size_t i = 0; i < dy.size(); ++i) dbias[i / pixels % c.out_channels] += dy[i];
  test::expect_near(grads[0], std::vector<float>(dx.begin(), dx.end()), tolerance(activations, scale), "dx");
  test::expect_near(grads[1], std::vector<float>(dweight.begin(), dweight.end()), 1e-4 * scale, "dweight");
  if (c.bias) test::expect_near(grads[2], std::vector<float>(dbias.begin(), dbias.end()), 1e-4 * scale, "dbias");
}

const Case k3_same{2, 3, 7, 9, 5, 3, 3, 1, 1, true};
const Case k3_stride2{2, 3, 9, 7, 4, 3, 3, 2, 1, true};
const Case k1_no_bias{3, 6, 5, 3, 7, 1, 1, 1, 0, false};
const Case k7_stride2{1, 2, 13, 11, 3, 7, 7, 2, 3, true};
const Case k2x3_stride3{2, 2, 8, 10, 3, 2, 3, 3, 0, true};
const Case k5_valid{1, 4, 6, 7, 9, 5, 5, 1, 0, true};
// Channels of a power of two: forward reads the weight in blocks of 16 reduction steps, here 9
// blocks for 3 groups of output channels.
const Case k3_wide{1, 16, 5, 6, 24, 3, 3, 1, 1, false};

// Output channels past a register block's 64 rows (and not a multiple of it): 70 rows of
// forward's and the weight gradient's products, 67 of the data gradient's.
const Case k3_many_channels{1, 67, 4, 5, 70, 3, 3, 1, 1, true};
// Past one 128 x 128 shared-memory block in every product: 133 (forward, weight gradient) and
// 131 (data gradient) rows, 144 pixel columns (forward, data gradient), 1179 weight columns.
const Case k3_blocks{2, 131, 9, 8, 133, 3, 3, 1, 1, true};

// Every kernel variant that runs on this device (a CPU's register blocks, the reference GPUs'
// shared-memory tiles: test::runnable_tile_targets), at sizes that are not multiples of their tiles.
TEST(Conv2d, ForwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    for (const Case& c : {k3_same, k3_stride2, k1_no_bias, k7_stride2, k2x3_stride3, k5_valid, k3_wide, k3_many_channels,
                          k3_blocks})
      expect_forward_matches(c);
  }
}

// Inference with fp16 weights (--weights fp16: a ViT's patch embedding): prepare() reads the
// weight through its fp16 texels into the float blocked copy; the reference takes the same
// fp16-rounded weights, so what differs is the sums' order alone (and fp16 activations' rounding).
TEST(Conv2d, ForwardWithFp16WeightsMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    for (DType activations : {DType::f32, DType::f16})
      for (const Case& c : {k3_stride2, k1_no_bias, k2x3_stride3, k3_many_channels})
        expect_forward_matches(c, activations, 1, DType::f16);
  }
}

TEST(Conv2d, BackwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    for (const Case& c : {k3_same, k3_stride2, k1_no_bias, k7_stride2, k2x3_stride3, k5_valid, k3_many_channels, k3_blocks})
      expect_backward_matches(c);
  }
}

// A reduction long enough that the weight gradient is split into slices and summed.
TEST(Conv2d, SplitWeightGradientMatchesCpu) {
  Case c{2, 2, 24, 24, 3, 3, 3, 1, 1, true};
  Conv2d conv = make(c);
  conv.infer({{c.batch, c.channels, c.height, c.width}});
  auto specs = conv.tensors();
  ASSERT_EQ(specs.back().name, "weight_grad_partial");
  EXPECT_GT(specs.back().shape[0], 1);
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    expect_backward_matches(c);
  }
}

// Every variant with fp16 activations and activation gradients against the CPU on the same
// fp16 values: forward, dx, and the float weight and bias gradients.
TEST(Conv2d, Fp16MatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    for (const Case& c : {k3_same, k3_stride2, k1_no_bias, k2x3_stride3, k3_many_channels}) {
      expect_forward_matches(c, DType::f16);
      expect_backward_matches(c, DType::f16);
    }
  }
}

// Reductions of thousands of steps, hundreds of shared-memory slices between barriers (lavapipe
// has been seen to return zeros from kernels that loop this long around barrier()): forward
// over 460 channels x 9 taps, the data gradient over 600 output channels x 9 taps, and the
// weight gradient over 3200 pixels in one slice (its 263k weights make enough blocks without
// split-K; the CPU's gradient is computed once, no data gradient). Every variant, fp32.
TEST(Conv2d, LongReductionsMatchCpu) {
  const Case long_forward{1, 460, 5, 6, 7, 3, 3, 1, 1, true}, long_data{1, 5, 5, 6, 600, 3, 3, 1, 1, false};
  const Case long_weight{1, 456, 40, 80, 64, 3, 3, 1, 1, false};
  Conv2d conv = make(long_weight);
  test::OpCheck check(test::context(), conv, {{long_weight.batch, long_weight.channels, 40, 80}}, 1, {}, {false});
  // The weight gradient: one slice of 3200 on lavapipe's register tiles (129 workgroups already),
  // six of 534 on a GPU's tiles (65 workgroups of 64x64 outputs).
  auto dy = test::random_values(static_cast<size_t>(element_count(check.output_shape)), 5);
  std::vector<double> dweight(check.tensors[0].size(), 0.0);
  for_each_tap(long_weight, [&](int64_t xi, int64_t wi, int64_t yi) {
    dweight[wi] += static_cast<double>(dy[yi]) * check.inputs[0][xi];
  });
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    expect_forward_matches(long_forward, DType::f32, 10);
    expect_backward_matches(long_data, DType::f32, 10);
    test::expect_near(check.backward(dy)[1], std::vector<float>(dweight.begin(), dweight.end()), 1e-3, "dweight");
  }
}

TEST(Conv2d, BackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{2, 2, 5, 5, 3, 3, 3, 1, 1, true}, Case{1, 3, 7, 6, 2, 3, 3, 2, 1, false},
                        Case{2, 3, 3, 5, 4, 1, 1, 1, 0, true}, Case{1, 2, 9, 8, 2, 7, 7, 2, 3, true}}) {
    Conv2d conv = make(c);
    test::OpCheck check(test::context(), conv, {{c.batch, c.channels, c.height, c.width}});
    check.expect_gradients_match();
  }
}

TEST(Conv2d, InitialisesLikePyTorch) {
  Conv2d conv(8, 3, 3, 1, 1, true);
  conv.infer({{1, 4, 5, 5}});
  auto specs = conv.tensors();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].shape, (Shape{8, 4, 3, 3}));
  EXPECT_EQ(specs[2].shape, (Shape{3, 8, 16}));  // the weight as forward reads it
  EXPECT_EQ(specs[2].role, TensorRole::prepared);
  EXPECT_EQ(specs[0].init.kind, Init::uniform);
  EXPECT_FLOAT_EQ(specs[0].init.scale, 1.0f / 6.0f);  // 1/sqrt(4*3*3)
  EXPECT_FLOAT_EQ(specs[1].init.scale, 1.0f / 6.0f);
  EXPECT_DOUBLE_EQ(conv.forward_flops(), 2.0 * 8 * 25 * 36);
}

TEST(Conv2d, ReadsItsFields) {
  auto conv = make_op(LayerConfig({{"name", "c"}, {"type", "conv2d"}, {"out_channels", 4}, {"kernel_h", 1},
                                   {"kernel_w", 3}, {"padding", 1}, {"bias", false}}));
  EXPECT_EQ(conv->infer({{1, 2, 5, 5}}), (Shape{1, 4, 7, 5}));
  EXPECT_EQ(conv->tensors().size(), 2u);  // the weight, and the weight as forward reads it
  EXPECT_THROW(make_op(LayerConfig({{"name", "c"}, {"type", "conv2d"}, {"kernel", 3}})), ModelError);
  EXPECT_THROW(conv->infer({{1, 2, 5}}), ShapeError);
}

}  // namespace
}  // namespace tessera
