// Checks one op in isolation, as ggml's test-backend-ops does: forward against a plain CPU
// reference, backward against central finite differences of the device's own forward.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "compute/op.h"
#include "compute/vk/context.h"

namespace tessera::test {

class OpCheck {
 public:
  // Builds `op` for inputs of these shapes and types (f32 where `input_dtypes` is shorter).
  // Inputs and parameters start uniform in [-1, 1] (state tensors: zeros, except those
  // named "running_var": ones); u32 inputs (labels) hold whole numbers set by the test.
  // Gradients are checked for f32 inputs only.
  OpCheck(vk::Context& context, Op& op, std::vector<Shape> input_shapes, uint32_t seed = 1,
          std::vector<DType> input_dtypes = {});

  Shape output_shape;
  std::vector<std::vector<float>> inputs;   // host copies, uploaded before each run
  std::vector<std::vector<float>> tensors;  // one per op.tensors() spec
  std::vector<TensorSpec> specs;
  bool training = true;

  // Runs forward and returns the output.
  std::vector<float> forward();
  // Runs forward then backward with this upstream gradient. Returns the gradient of every
  // input (empty where an input has none) followed by the gradient of every parameter.
  std::vector<std::vector<float>> backward(const std::vector<float>& output_grad);
  // Compares backward() with central differences of L = sum(output_grad * forward()) at up
  // to `samples` elements of each input and parameter: |analytic - numeric| <= tolerance *
  // max(1, |numeric|). Also checks that accumulating input gradients adds to what is there.
  void expect_gradients_match(double epsilon = 1e-2, double tolerance = 2e-2, int samples = 24);

 private:
  void upload();
  OpTensors bindings(bool backward, bool accumulate) const;
  void run(const OpTensors& t, bool backward);
  bool differentiable(size_t input) const;
  double loss(const std::vector<float>& output_grad);

  vk::Context& context_;
  Op& op_;
  std::vector<Shape> input_shapes_;
  std::vector<DType> input_dtypes_;
  uint32_t seed_;
  std::vector<std::unique_ptr<Tensor>> input_tensors_, input_grads_, op_tensors_, grads_;
  std::unique_ptr<Tensor> output_, output_grad_, step_;
};

// Uniform values in [low, high) from a seeded generator.
std::vector<float> random_values(size_t count, uint32_t seed, float low = -1, float high = 1);

// Expects two arrays to agree elementwise within tolerance * max(1, |expected|).
void expect_near(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance,
                 const char* what);

}  // namespace tessera::test
