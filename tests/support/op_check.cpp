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

OpCheck::OpCheck(vk::Context& context, Op& op, std::vector<Shape> input_shapes, uint32_t seed,
                 std::vector<DType> input_dtypes)
    : context_(context), op_(op), input_shapes_(std::move(input_shapes)), input_dtypes_(std::move(input_dtypes)),
      seed_(seed) {
  input_dtypes_.resize(input_shapes_.size(), DType::f32);
  output_shape = op.infer(input_shapes_);
  specs = op.tensors();
  for (size_t i = 0; i < input_shapes_.size(); ++i) {
    inputs.push_back(random_values(static_cast<size_t>(element_count(input_shapes_[i])), seed + 100 + i));
    input_tensors_.push_back(std::make_unique<Tensor>(context, "input" + std::to_string(i), input_shapes_[i],
                                                      input_dtypes_[i]));
    input_grads_.push_back(std::make_unique<Tensor>(context, "input_grad" + std::to_string(i), input_shapes_[i]));
  }
  for (size_t s = 0; s < specs.size(); ++s) {
    auto count = static_cast<size_t>(element_count(specs[s].shape));
    if (specs[s].role == TensorRole::parameter)
      tensors.push_back(random_values(count, seed + 200 + s));
    else
      tensors.push_back(std::vector<float>(count, specs[s].name == "running_var" ? 1.0f : 0.0f));
    op_tensors_.push_back(std::make_unique<Tensor>(context, specs[s].name, specs[s].shape, specs[s].dtype));
    grads_.push_back(specs[s].role == TensorRole::parameter
                         ? std::make_unique<Tensor>(context, specs[s].name + ".grad", specs[s].shape)
                         : nullptr);
  }
  output_ = std::make_unique<Tensor>(context, "output", output_shape);
  output_grad_ = std::make_unique<Tensor>(context, "output_grad", output_shape);
  step_ = std::make_unique<Tensor>(context, "step", Shape{2}, DType::u32);
  uint32_t step[2] = {0, 0};
  step_->upload(step, sizeof step);
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
  for (size_t s = 0; s < tensors.size(); ++s) {
    if (specs[s].role == TensorRole::saved) continue;
    op_tensors_[s]->upload(tensors[s]);
  }
}

bool OpCheck::differentiable(size_t input) const { return input_dtypes_[input] == DType::f32; }

OpTensors OpCheck::bindings(bool backward, bool accumulate) const {
  OpTensors t;
  for (size_t i = 0; i < input_tensors_.size(); ++i) {
    t.inputs.push_back(input_tensors_[i].get());
    if (!backward) continue;
    t.input_grads.push_back(differentiable(i) ? input_grads_[i].get() : nullptr);
    t.accumulate_input_grads.push_back(accumulate);
  }
  t.output = output_.get();
  t.output_grad = backward ? output_grad_.get() : nullptr;
  for (size_t s = 0; s < op_tensors_.size(); ++s) {
    t.tensors.push_back(op_tensors_[s].get());
    t.grads.push_back(backward ? grads_[s].get() : nullptr);
  }
  t.training = training;
  t.seed = seed_;
  t.step = step_.get();
  return t;
}

void OpCheck::run(const OpTensors& t, bool backward) {
  vk::Program program(context_);
  {
    vk::Recorder recorder(context_, program);
    op_.forward(recorder, context_.kernels(), t);
    if (backward) op_.backward(recorder, context_.kernels(), t);
    recorder.finish();
  }
  program.run();
}

std::vector<float> OpCheck::forward() {
  upload();
  run(bindings(false, false), false);
  return output_->download();
}

std::vector<std::vector<float>> OpCheck::backward(const std::vector<float>& output_grad) {
  // Backward must not depend on what forward left in state tensors (running statistics), so
  // state is reset by upload() and forward runs again in the same program.
  upload();
  output_grad_->upload(output_grad);
  for (auto& grad : grads_)
    if (grad) grad->upload(std::vector<float>(static_cast<size_t>(grad->count()), 0.0f));
  run(bindings(true, false), true);
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < input_tensors_.size(); ++i)
    grads.push_back(differentiable(i) ? input_grads_[i]->download() : std::vector<float>{});
  for (auto& grad : grads_)
    if (grad) grads.push_back(grad->download());
  return grads;
}

double OpCheck::loss(const std::vector<float>& output_grad) {
  auto y = forward();
  double sum = 0;
  for (size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(output_grad[i]) * y[i];
  return sum;
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
    std::shuffle(indices.begin(), indices.end(), generator);
    indices.resize(std::min(indices.size(), static_cast<size_t>(samples)));
    int reported = 0;
    for (size_t i : indices) {
      float original = values[i];
      values[i] = original + static_cast<float>(epsilon);
      double plus = loss(output_grad);
      values[i] = original - static_cast<float>(epsilon);
      double minus = loss(output_grad);
      values[i] = original;
      double numeric = (plus - minus) / (2 * epsilon);
      double got = analytic_targets[k][i];
      if (!(std::abs(got - numeric) <= tolerance * std::max(1.0, std::abs(numeric))) && reported++ < 5)
        ADD_FAILURE() << "d loss / d " << names[k] << "[" << i << "]: backward gives " << got
                      << ", central differences " << numeric;
    }
  }

  // Accumulation: a second consumer's gradient adds to what the first wrote.
  upload();
  output_grad_->upload(output_grad);
  std::vector<std::vector<float>> before;
  for (size_t i = 0; i < input_tensors_.size(); ++i) {
    before.push_back(random_values(inputs[i].size(), seed_ + 300 + static_cast<uint32_t>(i)));
    if (differentiable(i)) input_grads_[i]->upload(before.back());
  }
  run(bindings(true, true), true);
  for (size_t i = 0; i < input_tensors_.size(); ++i) {
    if (!differentiable(i)) continue;
    auto accumulated = input_grads_[i]->download();
    std::vector<float> expected(before[i].size());
    for (size_t e = 0; e < expected.size(); ++e) expected[e] = before[i][e] + analytic[i][e];
    expect_near(accumulated, expected, 1e-5, "accumulated input gradient");
  }
}

}  // namespace tessera::test
