// layer_norm and layer_scale against the CPU, fp32 and fp16, on rows of a ViT's sequence
// lengths (261 tokens: 256 patches, a class token and 4 registers) with widths that are not
// multiples of any workgroup.
#include <gtest/gtest.h>

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
        test::expect_near(check.forward(), expected, test::forward_tolerance(activations), "layer_norm");
      }
  }
}

TEST(LayerNorm, ReadsEpsAndRefusesTraining) {
  EXPECT_THROW(make_op(LayerConfig({{"name", "n"}, {"type", "layer_norm"}, {"eps", 0}})), ModelError);
  nlohmann::json model = {{"layers", {{{"name", "norm"}, {"type", "layer_norm"}}}}};
  try {
    Network network(model, Shape{2, 5}, true);
    FAIL() << "a layer norm was built for training";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("'norm' (layer_norm) runs in inference only"), std::string::npos) << e.what();
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
