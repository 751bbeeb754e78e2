// linear against plain CPU loops (forward and backward, with every kernel variant that runs on
// the device: test::runnable_tile_targets) and central differences.
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/linear.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Case {
  int64_t batch, in, out;
  bool bias;
};

TEST(Linear, ForwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (const Case& c : {Case{3, 7, 5, true}, Case{17, 33, 9, false}, Case{1, 1, 1, true}, Case{64, 40, 130, true}}) {
      Linear linear(c.out, c.bias);
      test::OpCheck check(test::context(), linear, {{c.batch, c.in}});
      std::vector<float> expected(static_cast<size_t>(c.batch * c.out));
      for (int64_t n = 0; n < c.batch; ++n)
        for (int64_t o = 0; o < c.out; ++o) {
          double sum = c.bias ? check.tensors[1][o] : 0.0;
          for (int64_t i = 0; i < c.in; ++i)
            sum += static_cast<double>(check.inputs[0][n * c.in + i]) * check.tensors[0][o * c.in + i];
          expected[n * c.out + o] = static_cast<float>(sum);
        }
      SCOPED_TRACE(test::describe(target));
      test::TileTargetScope scope(test::context(), target);
      test::expect_near(check.forward(), expected, 1e-4, "y");
    }
}

// y[n,o] = bias[o] + sum_i x[n,i] weight[o,i] in double, over every row of x.
std::vector<float> cpu_forward(const test::OpCheck& check, int64_t in, int64_t out, bool bias) {
  const auto& x = check.inputs[0];
  const auto& weight = check.tensors[0];
  int64_t rows = static_cast<int64_t>(x.size()) / in;
  std::vector<float> y(static_cast<size_t>(rows * out));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double sum = bias ? check.tensors[1][static_cast<size_t>(o)] : 0.0;
      for (int64_t i = 0; i < in; ++i)
        sum += static_cast<double>(x[static_cast<size_t>(n * in + i)]) * weight[static_cast<size_t>(o * in + i)];
      y[static_cast<size_t>(n * out + o)] = static_cast<float>(sum);
    }
  return y;
}

// Inference after Network::prepare reads weight^T [in, out] (transposed by conv2d's weight-blocking
// kernel with a block of one): against the CPU at sizes that are no multiple of the register
// tiles (8 lanes x 8 rows, 32 columns) or of the GPU's, in both activation types, 2-D and a
// ViT's 3-D input; and the unprepared forward of the same check, as training runs it.
TEST(Linear, PreparedForwardMatchesCpu) {
  struct Prepared {
    Shape input;
    int64_t out;
    bool bias;
  };
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (DType activations : {DType::f32, DType::f16})
      for (const Prepared& c : {Prepared{{3, 7}, 5, true}, Prepared{{1, 1}, 1, true}, Prepared{{17, 33}, 9, false},
                                Prepared{{2, 13, 40}, 130, true}, Prepared{{1, 197, 72}, 67, true},
                                Prepared{{66, 129}, 257, false}}) {
        Linear linear(c.out, c.bias);
        test::OpCheck check(test::context(), linear, {c.input}, 3, {}, {}, activations);
        int64_t in = c.input.back();
        auto expected = cpu_forward(check, in, c.out, c.bias);
        SCOPED_TRACE(test::describe(target) + (activations == DType::f16 ? " fp16 " : " fp32 ") + to_string(c.input) +
                     " -> " + std::to_string(c.out));
        test::TileTargetScope scope(test::context(), target);
        // Sums of up to 257 products of [-1, 1] values: float's rounding, relative to max(1, |y|).
        double tolerance = activations == DType::f16 ? test::forward_tolerance(activations) : 1e-5 * std::sqrt(in);
        test::expect_near(check.forward_prepared(), expected, tolerance, "prepared y");
        test::expect_near(check.forward(), expected, tolerance, "unprepared y");
      }
}

// Inference holds one copy of the weight: prepare() transposes it in its own buffer, through a
// scratch that shares the activations' buffers; a training graph, whose forward reads the weight
// as stored, allocates no scratch.
TEST(Linear, WeightTransposedInPlaceOnlyInInference) {
  auto linear = std::make_shared<Linear>(30, true);
  Network inference(linear, {{"x", {5, 20}, DType::f32, false}}, false);
  EXPECT_EQ(inference.layout().plan(test::context().allocator()).bytes.count("prepared weights"), 0u);
  inference.allocate(test::context());
  inference.initialise(3);
  auto weight = inference.layers()[0].tensors[0]->download();
  ASSERT_NE(inference.layers()[0].tensors[2], nullptr);
  EXPECT_EQ(inference.layers()[0].tensors[2]->shape(), (Shape{20, 30}));
  inference.prepare(test::context());
  auto transposed = inference.layers()[0].tensors[0]->download();
  ASSERT_EQ(transposed.size(), weight.size());
  for (size_t i = 0; i < 20; ++i)
    for (size_t o = 0; o < 30; ++o) ASSERT_EQ(transposed[i * 30 + o], weight[o * 20 + i]) << i << ", " << o;
  EXPECT_THROW(inference.prepare(test::context()), std::logic_error);  // a second transpose would undo it
  Network training(linear, {{"x", {5, 20}, DType::f32, true}}, true);
  training.allocate(test::context());
  EXPECT_EQ(training.layers()[0].tensors[2], nullptr);
}

// Inference with fp16 weights (--weights fp16): record_gemm reads the weight through its fp16
// texels and sums in float, so against a double reference on the same fp16-rounded weights only
// the sums' order differs (and, with fp16 activations, the output's one rounding). Sizes that are
// no multiple of any tile, over one register block's 64 rows, and a ViT's [batch, tokens, in];
// as stored and, after prepare(), transposed in fp16.
TEST(Linear, ForwardWithFp16WeightsMatchesCpu) {
  struct Tokens {
    Shape input;
    int64_t out;
    bool bias;
  };
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (DType activations : {DType::f32, DType::f16})
      for (const Tokens& c : {Tokens{{3, 7}, 5, true}, Tokens{{17, 33}, 9, false}, Tokens{{64, 40}, 130, true},
                              Tokens{{2, 261, 48}, 67, true}}) {
        Linear linear(c.out, c.bias);
        test::OpCheck check(test::context(), linear, {c.input}, 3, {}, {}, activations, DType::f16);
        ASSERT_EQ(check.specs[0].dtype, DType::f16);
        if (c.bias) {
          ASSERT_EQ(check.specs[1].dtype, DType::f32) << "a bias stays float";
        }
        for (float w : check.tensors[0]) ASSERT_EQ(w, from_half(to_half(std::vector<float>{w}))[0]);
        auto expected = cpu_forward(check, c.input.back(), c.out, c.bias);
        SCOPED_TRACE(test::describe(target) + (activations == DType::f16 ? ", fp16 activations" : ""));
        test::TileTargetScope scope(test::context(), target);
        double tolerance = activations == DType::f16 ? 1.0 / 1024 : 1e-4;
        test::expect_near(check.forward(), expected, tolerance, "y");
        test::expect_near(check.forward_prepared(), expected, tolerance, "prepared y");
      }
}

struct Gradients {
  std::vector<float> dx, dweight, dbias;
};

// dx = dy weight, dweight = dy^T x, dbias = sum_n dy in double.
Gradients cpu_backward(const test::OpCheck& check, const std::vector<float>& dy, const Case& c) {
  const auto& x = check.inputs[0];
  const auto& weight = check.tensors[0];
  Gradients g{std::vector<float>(x.size()), std::vector<float>(weight.size()), std::vector<float>(static_cast<size_t>(c.out))};
  for (int64_t n = 0; n < c.batch; ++n)
    for (int64_t i = 0; i < c.in; ++i) {
      double sum = 0;
      for (int64_t o = 0; o < c.out; ++o) sum += static_cast<double>(dy[n * c.out + o]) * weight[o * c.in + i];
      g.dx[n * c.in + i] = static_cast<float>(sum);
    }
  for (int64_t o = 0; o < c.out; ++o) {
    for (int64_t i = 0; i < c.in; ++i) {
      double sum = 0;
      for (int64_t n = 0; n < c.batch; ++n) sum += static_cast<double>(dy[n * c.out + o]) * x[n * c.in + i];
      g.dweight[o * c.in + i] = static_cast<float>(sum);
    }
    double sum = 0;
    for (int64_t n = 0; n < c.batch; ++n) sum += dy[n * c.out + o];
    g.dbias[o] = static_cast<float>(sum);
  }
  return g;
}

void expect_gradients(const std::vector<std::vector<float>>& grads, const Gradients& expected, bool bias, double tolerance) {
  test::expect_near(grads[0], expected.dx, tolerance, "dx");
  test::expect_near(grads[1], expected.dweight, tolerance, "dweight");
  if (bias) test::expect_near(grads[2], expected.dbias, tolerance, "dbias");
}

TEST(Linear, BackwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (const Case& c : {Case{3, 7, 5, true}, Case{19, 33, 9, false}, Case{64, 40, 130, true}}) {
      Linear linear(c.out, c.bias);
      test::OpCheck check(test::context(), linear, {{c.batch, c.in}});
      auto dy = test::random_values(static_cast<size_t>(c.batch * c.out), 5);
      SCOPED_TRACE(test::describe(target));
      test::TileTargetScope scope(test::context(), target);
      expect_gradients(check.backward(dy), cpu_backward(check, dy, c), c.bias, 1e-4);
    }
}

// An x over what one binding reaches (a bag of 100,000 patches of 1,536 features in fp16 against
// lavapipe's 128 MiB), here a binding of 4 KiB: both passes take it in windows of rows whose
// starts are 256-byte aligned in x and y (24 rows; 16 where y's rows are 24 fp16 values, 48
// bytes), the last one shorter.
TEST(Linear, WindowsOfRowsMatchCpu) {
  const Case c{150, 40, 24, true};
  for (vk::TileTarget target : test::runnable_tile_targets(test::context()))
    for (DType activations : {DType::f32, DType::f16}) {
      Linear linear(c.out, c.bias);
      test::OpCheck check(test::context(), linear, {{c.batch, c.in}}, 7, {}, {}, activations);
      auto dy = test::random_values(static_cast<size_t>(c.batch * c.out), 8);
      if (activations == DType::f16) dy = from_half(to_half(dy));
      target.largest_binding = 4096;
      SCOPED_TRACE(test::describe(target) + (activations == DType::f16 ? ", fp16" : ""));
      test::TileTargetScope scope(test::context(), target);
      const double tolerance = activations == DType::f16 ? 1e-2 : 1e-4;
      test::expect_near(check.forward(), cpu_forward(check, c.in, c.out, c.bias), tolerance, "y");
      expect_gradients(check.backward(dy), cpu_backward(check, dy, c), c.bias, tolerance);
    }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{4, 9, 5, true}, Case{3, 6, 11, false}}) {
    Linear linear(c.out, c.bias);
    test::OpCheck check(test::context(), linear, {{c.batch, c.in}});
    check.expect_gradients_match();
  }
}

TEST(Linear, InitialisesLikePyTorchAndReadsItsFields) {
  auto linear = make_op(LayerConfig({{"name", "fc"}, {"type", "linear"}, {"out_features", 10}}));
  EXPECT_EQ(linear->infer({{2, 16}}), (Shape{2, 10}));
  auto specs = linear->tensors();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].shape, (Shape{10, 16}));
  EXPECT_EQ(specs[2].shape, (Shape{16, 10}));
  EXPECT_EQ(specs[2].role, TensorRole::saved);
  EXPECT_TRUE(specs[2].inference_only);
  EXPECT_FLOAT_EQ(specs[0].init.scale, 0.25f);
  EXPECT_FLOAT_EQ(specs[1].init.scale, 0.25f);
  EXPECT_DOUBLE_EQ(linear->forward_flops(), 2.0 * 2 * 10 * 16);
  EXPECT_THROW(linear->infer({{2, 3, 4, 4}}), ShapeError);
  EXPECT_EQ(linear->infer({{2, 5, 16}}), (Shape{2, 5, 10}));  // a ViT's tokens
  EXPECT_DOUBLE_EQ(linear->forward_flops(), 2.0 * 2 * 5 * 10 * 16);
  EXPECT_THROW(make_op(LayerConfig({{"name", "fc"}, {"type", "linear"}, {"out_features", 0}})), ModelError);
}

}  // namespace
}  // namespace tessera
