#include "tests/support/op_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "compute/vk/recorder.h"

namespace tessera::test {

std::vector<float> random_values(size_t count, uint32_t seed, float low, float high) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(count);
  for (auto& v : values) v = distribution(generator);
  return values;
}

std::vector<int64_t> first_argmax_rows(const std::vector<float>& values, int64_t count, int64_t columns) {
  std::vector<int64_t> rows(static_cast<size_t>(columns), 0);
  for (int64_t c = 0; c < columns; ++c)
    for (int64_t n = 1; n < count; ++n)
      if (values[n * columns + c] > values[rows[c] * columns + c]) rows[c] = n;
  return rows;
}

double expect_relative(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance,
                       const std::string& what) {
  EXPECT_EQ(actual.size(), expected.size()) << what;
  if (actual.size() != expected.size()) return 0;
  double largest = 0, error = 0;
  size_t worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    largest = std::max(largest, std::abs(static_cast<double>(expected[i])));
    double e = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (!(e <= error)) {
      error = e;
      worst = i;
    }
  }
  EXPECT_LE(error, tolerance * largest) << what << ": max error " << error << " at [" << worst << "] (got "
                                        << actual[worst] << ", expected " << expected[worst] << "), max |expected| "
                                        << largest << ", relative " << error / std::max(largest, 1e-30);
  return largest;
}

void expect_near(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance,
                 const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double bound = tolerance * std::max(1.0, std::abs(static_cast<double>(expected[i])));
    if (!(std::abs(static_cast<double>(actual[i]) - expected[i]) <= bound) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", expected " << expected[i];
  }
}

namespace {

// Float inputs are activations: of the activations' type.
std::vector<DType> dtypes_of(std::vector<DType> dtypes, size_t inputs, DType activations) {
  dtypes.resize(inputs, DType::f32);
  for (auto& dtype : dtypes)
    if (dtype == DType::f32) dtype = activations;
  return dtypes;
}

std::vector<bool> gradients_of(std::vector<bool> gradients, const std::vector<DType>& dtypes) {
  for (size_t i = gradients.size(); i < dtypes.size(); ++i)
    gradients.push_back(dtypes[i] == DType::f32 || dtypes[i] == DType::f16);
  return gradients;
}

std::vector<GraphInput> graph_inputs(const std::vector<Shape>& shapes, const std::vector<DType>& dtypes,
                                     const std::vector<bool>& gradients) {
  std::vector<GraphInput> inputs;
  for (size_t i = 0; i < shapes.size(); ++i)
    inputs.push_back({"input" + std::to_string(i), shapes[i], dtypes[i], gradients[i]});
  return inputs;
}

}  // namespace

OpCheck::OpCheck(vk::Context& context, Op& op, std::vector<Shape> input_shapes, uint32_t seed,
                 std::vector<DType> input_dtypes, std::vector<bool> input_gradients, DType activations,
                 DType weights)
    : context_(context),
      input_shapes_(std::move(input_shapes)),
      input_dtypes_(dtypes_of(std::move(input_dtypes), input_shapes_.size(), activations)),
      input_gradients_(gradients_of(std::move(input_gradients), input_dtypes_)),
      seed_(seed),
      weights_(weights),
      // The test owns the op: the graph borrows it.
      network_(std::shared_ptr<Op>(std::shared_ptr<Op>(), &op),
               graph_inputs(input_shapes_, input_dtypes_, input_gradients_), op.has_backward() && weights == DType::f32) {
  network_.set_activation_dtype(activations);
  network_.set_weight_dtype(weights);
  network_.allocate(context);
  output_shape = network_.output_shape();
  specs = network_.layers()[0].specs;
  for (size_t i = 0; i < input_shapes_.size(); ++i) {
    inputs.push_back(random_values(static_cast<size_t>(element_count(input_shapes_[i])), seed + 100 + i));
    if (input_dtypes_[i] == DType::f16) inputs.back() = from_half(to_half(inputs.back()));
    input_tensors_.push_back(std::make_unique<Tensor>(context, "input" + std::to_string(i), input_shapes_[i],
                                                      input_dtypes_[i]));
  }
  for (size_t s = 0; s < specs.size(); ++s) {
    auto count = static_cast<size_t>(element_count(specs[s].shape));
    if (specs[s].role == TensorRole::parameter) {
      tensors.push_back(random_values(count, seed + 200 + s));
      if (specs[s].dtype == DType::f16) tensors.back() = from_half(to_half(tensors.back()));
    } else
      tensors.push_back(std::vector<float>(count, specs[s].name == "running_var" ? 1.0f : 0.0f));
  }
  step_ = std::make_unique<Tensor>(context, "step", Shape{2}, DType::u32);
}

void OpCheck::upload() {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (input_dtypes_[i] == DType::u32) {
      std::vector<uint32_t> labels(inputs[i].begin(), inputs[i].end());
      input_tensors_[i]->upload(labels.data(), labels.size() * 4);
    } else {
      input_tensors_[i]->upload(inputs[i]);
    }
  }
  upload_parameters(network_);
  uint32_t steps[2] = {step, 0};
  step_->upload(steps, sizeof steps);
}

void OpCheck::upload_parameters(Network& network) const {
  auto& layer = network.layers()[0];
  for (size_t s = 0; s < tensors.size(); ++s) {
    if (!in_checkpoint(specs[s].role)) continue;
    layer.tensors[s]->upload(tensors[s]);
  }
}

Network::Bound OpCheck::bound_inputs() const {
  Network::Bound bound;
  for (size_t i = 0; i < input_tensors_.size(); ++i) bound["input" + std::to_string(i)] = input_tensors_[i].get();
  return bound;
}

bool OpCheck::differentiable(size_t input) const { return input_gradients_[input]; }

std::vector<float> OpCheck::tensor_after_run(size_t s) const { return network_.layers()[0].tensors[s]->download(); }

void OpCheck::run(bool backward, bool accumulate) {
  Network::Bound bound = bound_inputs();
  Network::Pass pass{training, seed_, step_.get(), sample_offset};
  vk::Program program(context_);
  {
    vk::Recorder recorder(context_, program);
    network_.record_forward(recorder, context_.kernels(), bound, pass);
    if (backward) {
      // A second consumer's backward: the graph's own bindings, adding to the input gradients.
      OpTensors t = network_.bindings(0, bound, pass, true);
      t.accumulate_input_grads.assign(t.accumulate_input_grads.size(), accumulate);
      network_.layers()[0].op->backward(recorder, context_.kernels(), t);
    }
    recorder.finish();
  }
  program.run();
}

std::vector<float> OpCheck::forward() {
  upload();
  run(false, false);
  return network_.output().download();
}

std::vector<float> OpCheck::forward_prepared() {
  // The op in a graph of its own without gradients, as an inference job builds it, sharing the
  // inputs and the parameters' values.
  Network inference(network_.layers()[0].op,
                    graph_inputs(input_shapes_, input_dtypes_, std::vector<bool>(input_shapes_.size(), false)), false);
  inference.set_activation_dtype(network_.activation_dtype());
  inference.set_weight_dtype(weights_);
  inference.allocate(context_);
  upload();
  upload_parameters(inference);
  inference.prepare(context_);
  vk::Program program(context_);
  {
    vk::Recorder recorder(context_, program);
    inference.record_forward(recorder, context_.kernels(), bound_inputs(), {false, seed_, step_.get(), sample_offset});
    recorder.finish();
  }
  program.run();
  return inference.output().download();
}

std::vector<std::vector<float>> OpCheck::backward(const std::vector<float>& output_grad) {
  return run_backward(output_grad, nullptr);
}

std::vector<std::vector<float>> OpCheck::backward_adding(const std::vector<float>& output_grad,
                                                         const std::vector<std::vector<float>>& before) {
  return run_backward(output_grad, &before);
}

std::vector<std::vector<float>> OpCheck::run_backward(const std::vector<float>& output_grad,
                                                      const std::vector<std::vector<float>>* before) {
  // Backward must not depend on what forward left in state tensors (running statistics), so
  // state is reset by upload() and forward runs again in the same program.
  upload();
  network_.output_grad().upload(output_grad);
  auto& layer = network_.layers()[0];
  for (auto& grad : layer.grads)
    if (grad) grad->upload(std::vector<float>(static_cast<size_t>(grad->count()), 0.0f));
  if (before)
    for (size_t i = 0; i < input_tensors_.size(); ++i)
      if (differentiable(i)) network_.input_grad("input" + std::to_string(i)).upload(before->at(i));
  run(true, before != nullptr);
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < input_tensors_.size(); ++i)
    grads.push_back(differentiable(i) ? network_.input_grad("input" + std::to_string(i)).download()
                                      : std::vector<float>{});
  for (auto& grad : layer.grads)
    if (grad) grads.push_back(grad->download());
  return grads;
}

std::pair<double, double> OpCheck::loss(const std::vector<float>& output_grad) {
  auto y = forward();
  double sum = 0, magnitude = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    double term = static_cast<double>(output_grad[i]) * y[i];
    sum += term;
    magnitude += std::abs(term);
  }
  return {sum, magnitude};
}

void OpCheck::expect_gradients_match(double epsilon, double tolerance, int samples) {
  auto output_grad = random_values(static_cast<size_t>(element_count(output_shape)), seed_ + 7);
  auto analytic = backward(output_grad);

  // The values that gradients are taken with respect to: differentiable inputs, then parameters.
  std::vector<std::vector<float>*> targets;
  std::vector<std::string> names;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!differentiable(i)) continue;
    targets.push_back(&inputs[i]);
    names.push_back("input" + std::to_string(i));
  }
  for (size_t s = 0; s < specs.size(); ++s)
    if (specs[s].role == TensorRole::parameter) {
      targets.push_back(&tensors[s]);
      names.push_back(specs[s].name);
    }
  std::vector<std::vector<float>> analytic_targets;
  for (auto& g : analytic)
    if (!g.empty()) analytic_targets.push_back(g);
  ASSERT_EQ(analytic_targets.size(), targets.size());

  std::mt19937 generator(seed_ + 11);
  for (size_t k = 0; k < targets.size(); ++k) {
    auto& values = *targets[k];
    std::vector<size_t> indices(values.size());
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = i;
    if (indices.size() > static_cast<size_t>(samples)) {
      std::shuffle(indices.begin(), indices.end(), generator);
      indices.resize(static_cast<size_t>(samples));
    }
    std::vector<double> numeric(indices.size());
    double squares = 0, rounding = 0;
    for (size_t j = 0; j < indices.size(); ++j) {
      size_t i = indices[j];
      float original = values[i];
      values[i] = original + static_cast<float>(epsilon);
      auto [plus, plus_scale] = loss(output_grad);
      values[i] = original - static_cast<float>(epsilon);
      auto [minus, minus_scale] = loss(output_grad);
      values[i] = original;
      numeric[j] = (plus - minus) / (2 * epsilon);
      squares += numeric[j] * numeric[j];
      // float32 outputs carry a relative error of a few ulps each.
      rounding = std::max(rounding, 8 * 1.2e-7 * (plus_scale + minus_scale) / (2 * epsilon));
    }
    double scale = std::max(std::sqrt(squares / static_cast<double>(indices.size())), rounding / tolerance);
    int reported = 0;
    for (size_t j = 0; j < indices.size(); ++j) {
      double got = analytic_targets[k][indices[j]];
      if (!(std::abs(got - numeric[j]) <= tolerance * scale) && reported++ < 5)
        ADD_FAILURE() << "d loss / d " << names[k] << "[" << indices[j] << "]: backward gives " << got
                      << ", central differences " << numeric[j] << " (rms of the gradient " << scale << ")";
    }
  }

  // Accumulation: a second consumer's gradient adds to what the first wrote.
  upload();
  network_.output_grad().upload(output_grad);
  std::vector<std::vector<float>> before;
  for (size_t i = 0; i < input_tensors_.size(); ++i) {
    before.push_back(random_values(inputs[i].size(), seed_ + 300 + static_cast<uint32_t>(i)));
    if (differentiable(i)) network_.input_grad("input" + std::to_string(i)).upload(before.back());
  }
  run(true, true);
  for (size_t i = 0; i < input_tensors_.size(); ++i) {
    if (!differentiable(i)) continue;
    auto accumulated = network_.input_grad("input" + std::to_string(i)).download();
    std::vector<float> expected(before[i].size());
    for (size_t e = 0; e < expected.size(); ++e) expected[e] = before[i][e] + analytic[i][e];
    expect_near(accumulated, expected, 1e-5, "accumulated input gradient");
  }
}

}  // namespace tessera::test
