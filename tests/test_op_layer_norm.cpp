// layer_norm and layer_scale against the CPU, fp32 and fp16, on rows of a ViT's sequence
// lengths (261 tokens: 256 patches, a class token and 4 registers) with widths that are not
// multiples of any workgroup; layer_norm's backward (TransMIL trains it) against a double CPU
// loop and central differences, and over more rows than llvmpipe lets one invocation loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "compute/ops/layer_norm.h"
#include "compute/ops/layer_scale.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

std::vector<float> layer_norm_reference(const std::vector<float>& x, const std::vector<float>& weight,
                                        const std::vector<float>& bias, size_t width, double eps) {
  std::vector<float> y(x.size());
  for (size_t first = 0; first < x.size(); first += width) {
    double mean = 0, variance = 0;
    for (size_t i = 0; i < width; ++i) mean += x[first + i];
    mean /= static_cast<double>(width);
    for (size_t i = 0; i < width; ++i) variance += (x[first + i] - mean) * (x[first + i] - mean);
    variance /= static_cast<double>(width);
    for (size_t i = 0; i < width; ++i)
      y[first + i] = static_cast<float>((x[first + i] - mean) / std::sqrt(variance + eps) * weight[i] + bias[i]);
  }
  return y;
}

struct LayerNormGradients {
  std::vector<float> input, weight, bias;
};

// PyTorch's layer_norm_backward in double: with xhat = (x - mean) * inverse_std and g = dy * weight,
// dx = inverse_std * (g - mean(g) - xhat * mean(g * xhat)); dweight = sum dy * xhat, dbias = sum dy.
LayerNormGradients layer_norm_backward_reference(const std::vector<float>& x, const std::vector<float>& weight,
                                                 const std::vector<float>& dy, size_t width, double eps) {
  LayerNormGradients grads{std::vector<float>(x.size()), std::vector<float>(width), std::vector<float>(width)};
  std::vector<double> dweight(width, 0.0), dbias(width, 0.0), normalised(width);
  for (size_t first = 0; first < x.size(); first += width) {
    double mean = 0, variance = 0;
    for (size_t i = 0; i < width; ++i) mean += x[first + i];
    mean /= static_cast<double>(width);
    for (size_t i = 0; i < width; ++i) variance += (x[first + i] - mean) * (x[first + i] - mean);
    double inverse_std = 1 / std::sqrt(variance / static_cast<double>(width) + eps);
    double g_mean = 0, g_xhat_mean = 0;
    for (size_t i = 0; i < width; ++i) {
      normalised[i] = (x[first + i] - mean) * inverse_std;
      double g = static_cast<double>(dy[first + i]) * weight[i];
      g_mean += g;
      g_xhat_mean += g * normalised[i];
      dweight[i] += static_cast<double>(dy[first + i]) * normalised[i];
      dbias[i] += dy[first + i];
    }
    g_mean /= static_cast<double>(width);
    g_xhat_mean /= static_cast<double>(width);
    for (size_t i = 0; i < width; ++i) {
      double g = static_cast<double>(dy[first + i]) * weight[i];
      grads.input[first + i] = static_cast<float>(inverse_std * (g - g_mean - normalised[i] * g_xhat_mean));
    }
  }
  for (size_t i = 0; i < width; ++i) {
    grads.weight[i] = static_cast<float>(dweight[i]);
    grads.bias[i] = static_cast<float>(dbias[i]);
  }
  return grads;
}

// fp32: the float sums' rounding; fp16: the stored input gradient's rounding (2^-11 relative) with
// room for the float statistics computed from fp16 values.
double backward_tolerance(DType activations) { return activations == DType::f16 ? 4.0 / 2048 : 2e-5; }

// Runs `check`'s backward for a random upstream gradient, overwriting and then adding to given
// input gradients, and holds every gradient to the double reference.
void expect_backward_matches_cpu(test::OpCheck& check, DType activations, double eps, uint32_t seed) {
  auto dy = test::random_values(check.inputs[0].size(), seed);
  if (activations == DType::f16) dy = from_half(to_half(dy));
  const auto width = static_cast<size_t>(check.output_shape.back());
  auto expected = layer_norm_backward_reference(check.inputs[0], check.tensors[0], dy, width, eps);
  const double tolerance = backward_tolerance(activations);
  auto grads = check.backward(dy);
  ASSERT_EQ(grads.size(), 3u);
  if (width == 1) {
    // One element a row: x-hat is 0 and dx = invstd (g dy - g dy) = 0, where a device that
    // fuses the difference into an FMA keeps g dy's rounding, times 1/sqrt(eps): those terms' scale.
    double terms = 0;
    for (float d : dy) terms = std::max(terms, std::abs(static_cast<double>(check.tensors[0][0]) * d) / std::sqrt(eps));
    for (float d : grads[0]) EXPECT_LE(std::abs(d), tolerance * terms) << "d input of rows of one element";
  } else {
    test::expect_relative(grads[0], expected.input, tolerance, "d input");
  }
  test::expect_relative(grads[1], expected.weight, tolerance, "d weight");
  test::expect_relative(grads[2], expected.bias, tolerance, "d bias");

  // A second consumer of the input (a residual branch): added to what is there.
  auto before = test::random_values(check.inputs[0].size(), seed + 1);
  if (activations == DType::f16) before = from_half(to_half(before));
  auto added = check.backward_adding(dy, {before});
  for (size_t i = 0; i < before.size(); ++i) before[i] += expected.input[i];
  test::expect_relative(added[0], before, tolerance, "d input added to another's");
  test::expect_relative(added[1], expected.weight, tolerance, "d weight beside an added input gradient");
}

TEST(LayerNorm, ForwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    test::TileTargetScope scope(test::context(), target);
    for (DType activations : {DType::f32, DType::f16})
      for (Shape shape : {Shape{2, 261, 77}, Shape{1025, 40}, Shape{3, 5, 1}, Shape{2, 7, 300}}) {
        SCOPED_TRACE(target.device_type + " tiles, " + (activations == DType::f16 ? "fp16 " : "fp32 ") +
                     to_string(shape));
        LayerNorm norm(1e-6f);
        test::OpCheck check(test::context(), norm, {shape}, 3, {}, {}, activations);
        // A residual stream's offset, far above its spread: a one-pass variance would cancel.
        for (auto& x : check.inputs[0]) x = 60.0f + 3.0f * x;
        if (activations == DType::f16) check.inputs[0] = from_half(to_half(check.inputs[0]));
        auto expected = layer_norm_reference(check.inputs[0], check.tensors[0], check.tensors[1],
                                             static_cast<size_t>(shape.back()), 1e-6);
        // forward() is a training forward (which also saves the statistics); an inference graph
        // runs the inference kernel: the same values, bit for bit.
        auto training = check.forward();
        test::expect_near(training, expected, test::forward_tolerance(activations), "layer_norm");
        EXPECT_EQ(check.forward_prepared(), training);
      }
  }
}

TEST(LayerNorm, ReadsEpsAndKeepsStatisticsOnlyForTraining) {
  EXPECT_THROW(make_op(LayerConfig({{"name", "n"}, {"type", "layer_norm"}, {"eps", 0}})), ModelError);
  nlohmann::json model = {{"layers", {{{"name", "norm"}, {"type", "layer_norm"}}}}};
  auto statistics = [](const Network& network) {
    std::vector<Shape> shapes;
    for (auto& placed : network.layout().tensors)
      if (placed.name == "norm.statistics") shapes.push_back(placed.shape);
    return shapes;
  };
  EXPECT_EQ(statistics(Network(model, Shape{2, 3, 5}, true)), std::vector<Shape>{Shape({6, 2})});
  // An inference graph (a ViT's) places no statistics: its memory is what it was.
  EXPECT_TRUE(statistics(Network(model, Shape{2, 3, 5}, false)).empty());
}

TEST(LayerNorm, BackwardMatchesCpu) {
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    test::TileTargetScope scope(test::context(), target);
    for (DType activations : {DType::f32, DType::f16})
      for (Shape shape : {Shape{2, 261, 77}, Shape{3, 5, 1}, Shape{2, 7, 300}}) {
        SCOPED_TRACE(target.device_type + " tiles, " + (activations == DType::f16 ? "fp16 " : "fp32 ") +
                     to_string(shape));
        LayerNorm norm(1e-5f);
        test::OpCheck check(test::context(), norm, {shape}, 5, {}, {}, activations);
        for (auto& x : check.inputs[0]) x = 60.0f + 3.0f * x;  // a residual stream's offset
        if (activations == DType::f16) check.inputs[0] = from_half(to_half(check.inputs[0]));
        expect_backward_matches_cpu(check, activations, 1e-5, 21);
      }
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  for (Shape shape : {Shape{3, 37}, Shape{2, 2, 130}}) {
    SCOPED_TRACE(to_string(shape));
    LayerNorm norm(1e-5f);
    test::OpCheck check(test::context(), norm, {shape}, 7);
    check.expect_gradients_match(1e-2, 2e-2, 64);
  }
  // On a graph input without a gradient (a head's features): the parameters' alone.
  LayerNorm norm(1e-5f);
  test::OpCheck check(test::context(), norm, {Shape{5, 24}}, 8, {}, {false});
  check.expect_gradients_match(1e-2, 2e-2, 64);
}

// 70,000 rows: the parameter gradients' sums over the rows are shared by a workgroup's
// invocations (llvmpipe ends an invocation's loops after 65,535 iterations, silently).
TEST(LayerNorm, BackwardOverMoreRowsThanOneInvocationLoops) {
  for (DType activations : {DType::f32, DType::f16}) {
    SCOPED_TRACE(activations == DType::f16 ? "fp16" : "fp32");
    LayerNorm norm(1e-5f);
    test::OpCheck check(test::context(), norm, {Shape{70000, 16}}, 9, {}, {}, activations);
    expect_backward_matches_cpu(check, activations, 1e-5, 31);
    if (activations == DType::f32) check.expect_gradients_match(1e-2, 2e-2, 4);
  }
}

TEST(LayerScale, ForwardMatchesCpu) {
  for (DType activations : {DType::f32, DType::f16})
    for (Shape shape : {Shape{2, 261, 37}, Shape{1, 1025, 5}}) {
      LayerScale scale(1e-5f);
      test::OpCheck check(test::context(), scale, {shape}, 4, {}, {}, activations);
      const auto width = static_cast<size_t>(shape.back());
      std::vector<float> expected(check.inputs[0].size());
      for (size_t i = 0; i < expected.size(); ++i) expected[i] = check.inputs[0][i] * check.tensors[0][i % width];
      test::expect_near(check.forward(), expected, test::forward_tolerance(activations), "layer_scale");
    }
}

TEST(LayerScale, StartsAtItsInitialValue) {
  LayerScale scale(1e-5f);
  scale.infer({{2, 8}});
  auto specs = scale.tensors();
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].name, "gamma");
  EXPECT_EQ(specs[0].init.kind, Init::constant);
  EXPECT_FLOAT_EQ(specs[0].init.scale, 1e-5f);
}

}  // namespace
}  // namespace tessera
