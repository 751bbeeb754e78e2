// linear against plain CPU loops (forward and backward, with every kernel variant that runs on
// the device: test::runnable_tile_targets) and central differences.
#include <gtest/gtest.h>

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

// Inference with fp16 weights (--weights fp16): record_gemm reads the weight through its fp16
// texels and sums in float, so against a double reference on the same fp16-rounded weights only
// the sums' order differs (and, with fp16 activations, the output's one rounding). Sizes that are
// no multiple of any tile, over one register block's 64 rows, and a ViT's [batch, tokens, in].
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
        const int64_t in = c.input.back(), rows = element_count(c.input) / in;
        for (float w : check.tensors[0]) ASSERT_EQ(w, from_half(to_half(std::vector<float>{w}))[0]);
        std::vector<float> expected(static_cast<size_t>(rows * c.out));
        for (int64_t n = 0; n < rows; ++n)
          for (int64_t o = 0; o < c.out; ++o) {
            double sum = c.bias ? check.tensors[1][o] : 0.0;
            for (int64_t i = 0; i < in; ++i)
              sum += static_cast<double>(check.inputs[0][n * in + i]) * check.tensors[0][o * in + i];
            expected[n * c.out + o] = static_cast<float>(sum);
          }
        SCOPED_TRACE(test::describe(target) + (activations == DType::f16 ? ", fp16 activations" : ""));
        test::TileTargetScope scope(test::context(), target);
        test::expect_near(check.forward(), expected, activations == DType::f16 ? 1.0 / 1024 : 1e-4, "y");
      }
}

TEST(Linear, BackwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context()))
    for (const Case& c : {Case{3, 7, 5, true}, Case{19, 33, 9, false}, Case{64, 40, 130, true}}) {
      Linear linear(c.out, c.bias);
      test::OpCheck check(test::context(), linear, {{c.batch, c.in}});
      auto dy = test::random_values(static_cast<size_t>(c.batch * c.out), 5);
      SCOPED_TRACE(test::describe(target));
      test::TileTargetScope scope(test::context(), target);
      auto grads = check.backward(dy);
      const auto& x = check.inputs[0];
      const auto& weight = check.tensors[0];
      std::vector<float> dx(x.size()), dweight(weight.size()), dbias(static_cast<size_t>(c.out));
      for (int64_t n = 0; n < c.batch; ++n)
        for (int64_t i = 0; i < c.in; ++i) {
          double sum = 0;
          for (int64_t o = 0; o < c.out; ++o) sum += static_cast<double>(dy[n * c.out + o]) * weight[o * c.in + i];
          dx[n * c.in + i] = static_cast<float>(sum);
        }
      for (int64_t o = 0; o < c.out; ++o) {
        for (int64_t i = 0; i < c.in; ++i) {
          double sum = 0;
          for (int64_t n = 0; n < c.batch; ++n) sum += static_cast<double>(dy[n * c.out + o]) * x[n * c.in + i];
          dweight[o * c.in + i] = static_cast<float>(sum);
        }
        double sum = 0;
        for (int64_t n = 0; n < c.batch; ++n) sum += dy[n * c.out + o];
        dbias[o] = static_cast<float>(sum);
      }
      test::expect_near(grads[0], dx, 1e-4, "dx");
      test::expect_near(grads[1], dweight, 1e-4, "dweight");
      if (c.bias) test::expect_near(grads[2], dbias, 1e-4, "dbias");
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
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].shape, (Shape{10, 16}));
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
