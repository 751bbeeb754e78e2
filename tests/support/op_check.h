// Checks one op in isolation, as ggml's test-backend-ops does: forward against a plain CPU
// reference, backward against central finite differences of the device's own forward. The op
// runs as a one-layer graph of compute/network.h, so its tensors are bound where every
// model's are.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compute/network.h"
#include "compute/op.h"
#include "compute/vk/context.h"

namespace tessera::test {

class OpCheck {
 public:
  // Builds `op` for inputs of these shapes and types (f32 where `input_dtypes` is shorter).
  // Inputs and parameters start uniform in [-1, 1] (state tensors: zeros, except those
  // named "running_var": ones); u32 inputs (labels) hold whole numbers set by the test.
  // Gradients are computed and checked for f32 inputs unless `input_gradients` says otherwise.
  // `op` must outlive the check; an inference-only op (Op::has_backward) runs as in inference,
  // forward only. With `activations` f16 the op runs as in mixed precision:
  // float inputs, the output and every activation gradient are fp16 (the host copies of the
  // inputs are rounded to fp16 values, so a float reference sees what the device sees).
  // With `weights` f16 the op runs as in inference with fp16 weights (Network::set_weight_dtype:
  // forward only), and the host copies of those weights are rounded to fp16 values likewise.
  OpCheck(vk::Context& context, Op& op, std::vector<Shape> input_shapes, uint32_t seed = 1,
          std::vector<DType> input_dtypes = {}, std::vector<bool> input_gradients = {},
          DType activations = DType::f32, DType weights = DType::f32);

  Shape output_shape;
  std::vector<std::vector<float>> inputs;   // host copies, uploaded before each run
  std::vector<std::vector<float>> tensors;  // one per op.tensors() spec
  std::vector<TensorSpec> specs;
  bool training = true;
  uint32_t step = 0;           // the optimizer step the op sees (dropout masks)
  uint32_t sample_offset = 0;  // the micro-batch's first sample in its batch

  // Runs forward and returns the output.
  std::vector<float> forward();
  // Runs forward as an inference job does once its weights are loaded: in a graph without
  // gradients, after Network::prepare, so that the op reads its prepared tensors
  // (TensorRole::prepared). Same inputs and parameters as forward().
  std::vector<float> forward_prepared();
  // Runs forward then backward with this upstream gradient. Returns the gradient of every
  // input (empty where an input has none) followed by the gradient of every parameter.
  std::vector<std::vector<float>> backward(const std::vector<float>& output_grad);
  // backward() as a second consumer of the inputs runs it (OpTensors::accumulate_input_grads):
  // each input's gradient starts at `before[i]` and backward adds to it.
  std::vector<std::vector<float>> backward_adding(const std::vector<float>& output_grad,
                                                  const std::vector<std::vector<float>>& before);
  // The op's tensor `s` (a TensorSpec's) as the last run left it (running statistics).
  std::vector<float> tensor_after_run(size_t s) const;
  // Compares backward() with central differences of L = sum(output_grad * forward()) at
  // every element of each input and parameter of up to `samples` elements (else at `samples`
  // of them). The measure is scale-free, as in ggml's test-backend-ops: each element's error
  // against the root mean square of the tensor's numeric gradient, |analytic - numeric| <=
  // tolerance * rms (with a floor at the finite differences' own rounding error), so a small
  // gradient is checked as strictly as a large one. Also checks that accumulating input
  // gradients adds to what is there.
  void expect_gradients_match(double epsilon = 1e-2, double tolerance = 2e-2, int samples = 512);

 private:
  void upload();
  void upload_parameters(Network& network) const;
  Network::Bound bound_inputs() const;
  void run(bool backward, bool accumulate);
  // Runs forward and backward from zeroed parameter gradients; input gradients start at
  // `before` where accumulating. Returns what backward() returns.
  std::vector<std::vector<float>> run_backward(const std::vector<float>& output_grad,
                                               const std::vector<std::vector<float>>* before);
  bool differentiable(size_t input) const;
  // sum(output_grad * forward()), and sum |output_grad * forward()| (its rounding scale).
  std::pair<double, double> loss(const std::vector<float>& output_grad);

  vk::Context& context_;
  std::vector<Shape> input_shapes_;
  std::vector<DType> input_dtypes_;
  std::vector<bool> input_gradients_;
  uint32_t seed_;
  DType weights_;
  Network network_;
  std::vector<std::unique_ptr<Tensor>> input_tensors_;
  std::unique_ptr<Tensor> step_;
};

// Uniform values in [low, high) from a seeded generator.
std::vector<float> random_values(size_t count, uint32_t seed, float low = -1, float high = 1);

// The first of rows [0, count) of a row-major [rows, columns] array with the largest value, per
// column: the reference of the bag ops whose ties go to the first instance.
std::vector<int64_t> first_argmax_rows(const std::vector<float>& values, int64_t count, int64_t columns);

// The tolerance of expect_near for a forward pass against a float CPU reference on the same
// (fp16-rounded) inputs: 1e-5 in fp32; in fp16, where each stored value is rounded once by up to
// 2^-11 of itself, 4 x 2^-11.
inline double forward_tolerance(DType activations) { return activations == DType::f16 ? 4.0 / 2048 : 1e-5; }

// Scale-free: the largest error against the largest reference value, max |actual - expected| <=
// tolerance * max |expected| (a reference of zeros needs zeros), so a gradient summed over
// 70,000 rows is held as strictly as one over 5. Returns max |expected|.
double expect_relative(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance,
                       const std::string& what);

// Expects two arrays to agree elementwise within tolerance * max(1, |expected|).
void expect_near(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance,
                 const char* what);

}  // namespace tessera::test
