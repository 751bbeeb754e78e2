// gelu, silu and the packed SwiGLU gate against the CPU, fp32 and fp16; timm's SwiGluPacked MLP
// (fc1, gate, fc2) as a graph against a CPU loop over the same weights.
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/activation.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

double gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double silu(double x) { return x / (1 + std::exp(-x)); }

TEST(Activation, GeluAndSiluMatchCpu) {
  for (auto function : {Activation::Function::gelu, Activation::Function::silu})
    for (DType activations : {DType::f32, DType::f16})
      for (Shape shape : {Shape{2, 261, 13}, Shape{1025, 3}, Shape{5}}) {  // whole and partial groups of four
        Activation activation(function);
        SCOPED_TRACE(activation.type() + (activations == DType::f16 ? " fp16 " : " fp32 ") + to_string(shape));
        test::OpCheck check(test::context(), activation, {shape}, 5, {}, {}, activations);
        // From deep in the negative tail (where SiLU's exp(-x) overflows) to large positive values.
        auto& x = check.inputs[0];
        for (size_t i = 0; i < x.size(); ++i) x[i] = i % 97 == 0 ? -120.0f + static_cast<float>(i % 7) : 8.0f * x[i];
        if (activations == DType::f16) x = from_half(to_half(x));
        std::vector<float> expected(x.size());
        for (size_t i = 0; i < x.size(); ++i)
          expected[i] = static_cast<float>(function == Activation::Function::gelu ? gelu(x[i]) : silu(x[i]));
        test::expect_near(check.forward(), expected, test::forward_tolerance(activations), activation.type().c_str());
      }
}

// GELU's erf on a fine grid: the approximation, not only the test's random points.
TEST(Activation, GeluIsWithinFloatOfErf) {
  Activation activation(Activation::Function::gelu);
  const int count = 20001;
  test::OpCheck check(test::context(), activation, {{count}});
  for (int i = 0; i < count; ++i)
    check.inputs[0][static_cast<size_t>(i)] = -10.0f + 20.0f * static_cast<float>(i) / (count - 1);
  auto y = check.forward();
  double worst = 0;
  for (int i = 0; i < count; ++i) {
    double x = check.inputs[0][static_cast<size_t>(i)];
    worst = std::max(worst, std::abs(y[static_cast<size_t>(i)] - gelu(x)) / std::max(1.0, std::abs(gelu(x))));
  }
  EXPECT_LT(worst, 1e-6);
}

TEST(SwiGlu, GatesTheFirstHalf) {
  for (DType activations : {DType::f32, DType::f16})
    for (Shape shape : {Shape{2, 261, 2 * 45}, Shape{1025, 2 * 3}}) {
      SwiGlu gate;
      test::OpCheck check(test::context(), gate, {shape}, 6, {}, {}, activations);
      ASSERT_EQ(check.output_shape.back(), shape.back() / 2);
      const auto& x = check.inputs[0];
      const size_t hidden = static_cast<size_t>(shape.back() / 2);
      std::vector<float> expected(x.size() / 2);
      for (size_t i = 0; i < expected.size(); ++i) {
        size_t row = i / hidden, column = i % hidden;
        // timm's GluMlp(gate_last=False): act(x1) * x2, x1 the first half
        expected[i] = static_cast<float>(silu(x[row * 2 * hidden + column]) * x[row * 2 * hidden + hidden + column]);
      }
      test::expect_near(check.forward(), expected, test::forward_tolerance(activations), "swiglu");
    }
  SwiGlu gate;
  EXPECT_THROW(gate.infer({{3, 7}}), ShapeError);
}

// fc1 -> swiglu -> fc2 as a graph of layers, as the vit family builds timm's SwiGLUPacked MLP.
TEST(SwiGlu, PackedMlpMatchesCpu) {
  const int64_t rows = 261, width = 24, hidden = 2 * 20;
  nlohmann::json model = {{"layers",
                           {{{"name", "fc1"}, {"type", "linear"}, {"out_features", hidden}},
                            {{"name", "gate"}, {"type", "swiglu"}},
                            {{"name", "fc2"}, {"type", "linear"}, {"out_features", width}}}}};
  for (DType activations : {DType::f32, DType::f16}) {
    Network network(model, {{"input", {1, rows, width}, activations}}, false);
    network.set_activation_dtype(activations);
    network.allocate(test::context());
    network.initialise(7);
    auto x = from_half(to_half(test::random_values(static_cast<size_t>(rows * width), 8)));
    Tensor input(test::context(), "input", {1, rows, width}, activations);
    input.upload(x);
    InferenceProgram program(test::context(), network, {{"input", &input}});
    program.run();
    auto w1 = network.layers()[0].tensors[0]->download(), b1 = network.layers()[0].tensors[1]->download();
    auto w2 = network.layers()[2].tensors[0]->download(), b2 = network.layers()[2].tensors[1]->download();
    std::vector<float> expected(static_cast<size_t>(rows * width));
    std::vector<double> h(static_cast<size_t>(hidden)), g(static_cast<size_t>(hidden / 2));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < hidden; ++o) {
        double sum = b1[static_cast<size_t>(o)];
        for (int64_t i = 0; i < width; ++i)
          sum += static_cast<double>(w1[static_cast<size_t>(o * width + i)]) * x[static_cast<size_t>(r * width + i)];
        h[static_cast<size_t>(o)] = sum;
      }
      for (int64_t j = 0; j < hidden / 2; ++j)
        g[static_cast<size_t>(j)] = silu(h[static_cast<size_t>(j)]) * h[static_cast<size_t>(hidden / 2 + j)];
      for (int64_t o = 0; o < width; ++o) {
        double sum = b2[static_cast<size_t>(o)];
        for (int64_t j = 0; j < hidden / 2; ++j)
          sum += static_cast<double>(w2[static_cast<size_t>(o * hidden / 2 + j)]) * g[static_cast<size_t>(j)];
        expected[static_cast<size_t>(r * width + o)] = static_cast<float>(sum);
      }
    }
    // In fp16 the hidden activations are stored rounded too: one more rounding on the way.
    test::expect_near(network.output().download(), expected, activations == DType::f16 ? 8.0 / 2048 : 1e-5, "mlp");
  }
}

}  // namespace
}  // namespace tessera
