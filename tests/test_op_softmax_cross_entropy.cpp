// Softmax cross-entropy against a CPU reference in double, central differences with class
// weights, and large logits; the training metrics' loss sum (metrics_accumulate) with both
// reduction variants, in fp32 and fp16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "compute/op.h"
#include "compute/ops/softmax_cross_entropy.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

// logits [N,C], labels [N], weights [C] -> l [N], with sum(l) = PyTorch's weighted mean
std::vector<float> cross_entropy_cpu(const std::vector<float>& logits, const std::vector<float>& labels,
                                     const std::vector<float>& weights) {
  size_t samples = labels.size(), classes = weights.size();
  double total = 0;
  for (float label : labels) total += weights[static_cast<size_t>(label)];
  std::vector<float> loss(samples);
  for (size_t n = 0; n < samples; ++n) {
    double sum = 0;
    for (size_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(logits[n * classes + c]));
    auto label = static_cast<size_t>(labels[n]);
    loss[n] = static_cast<float>(weights[label] * (std::log(sum) - logits[n * classes + label]) / total);
  }
  return loss;
}

// The gradient of sum(dloss * l) for the loss above (PyTorch's weighted mean), in double.
std::vector<float> cross_entropy_grad_cpu(const std::vector<float>& logits, const std::vector<float>& labels,
                                          const std::vector<float>& weights, const std::vector<float>& dloss) {
  size_t samples = labels.size(), classes = weights.size();
  double total = 0;
  for (float label : labels) total += weights[static_cast<size_t>(label)];
  std::vector<float> grad(samples * classes);
  for (size_t n = 0; n < samples; ++n) {
    double sum = 0;
    for (size_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(logits[n * classes + c]));
    auto label = static_cast<size_t>(labels[n]);
    for (size_t c = 0; c < classes; ++c) {
      double p = std::exp(static_cast<double>(logits[n * classes + c])) / sum;
      grad[n * classes + c] = static_cast<float>(dloss[n] * weights[label] / total * (p - (c == label ? 1 : 0)));
    }
  }
  return grad;
}

// Every class in turn, so that class weights do not cancel out.
void set_labels(test::OpCheck& check, size_t classes) {
  for (size_t n = 0; n < check.inputs[1].size(); ++n) check.inputs[1][n] = static_cast<float>((n + 3) % classes);
}

TEST(SoftmaxCrossEntropy, RejectsMismatchedShapes) {
  SoftmaxCrossEntropy loss;
  EXPECT_THROW(loss.infer({{4, 3}, {5}}), ShapeError);
  EXPECT_THROW(loss.infer({{4, 3, 1}, {4}}), ShapeError);
  EXPECT_EQ(loss.infer({{4, 3}, {4}}), (Shape{4}));
}

TEST(SoftmaxCrossEntropy, ForwardMatchesCpuWithClassWeights) {
  SoftmaxCrossEntropy loss;
  test::OpCheck check(test::context(), loss, {{13, 5}, {13}}, 1, {DType::f32, DType::u32});
  set_labels(check, 5);
  for (auto& x : check.inputs[0]) x *= 4;
  check.tensors[0] = {1.0f, 0.5f, 2.0f, 3.0f, 0.25f};
  test::expect_near(check.forward(), cross_entropy_cpu(check.inputs[0], check.inputs[1], check.tensors[0]), 1e-5,
                    "weighted cross-entropy");
}

TEST(SoftmaxCrossEntropy, UnweightedSumIsTheMeanNegativeLogLikelihood) {
  SoftmaxCrossEntropy loss;
  test::OpCheck check(test::context(), loss, {{2, 2}, {2}}, 1, {DType::f32, DType::u32});
  check.inputs[0] = {0.0f, 0.0f, 2.0f, 0.0f};
  check.inputs[1] = {1.0f, 0.0f};
  check.tensors[0] = {1.0f, 1.0f};
  auto l = check.forward();
  EXPECT_NEAR(l[0] + l[1], (std::log(2.0) + std::log(1.0 + std::exp(-2.0))) / 2, 1e-6);
}

TEST(SoftmaxCrossEntropy, LargeLogitsStayFinite) {
  SoftmaxCrossEntropy loss;
  test::OpCheck check(test::context(), loss, {{4, 3}, {4}}, 1, {DType::f32, DType::u32});
  set_labels(check, 3);
  for (auto& x : check.inputs[0]) x *= 1000;
  check.tensors[0] = {1.0f, 1.0f, 1.0f};
  test::expect_near(check.forward(), cross_entropy_cpu(check.inputs[0], check.inputs[1], check.tensors[0]), 1e-4,
                    "cross-entropy of large logits");
  auto grads = check.backward(std::vector<float>(4, 1.0f));
  for (float g : grads[0]) EXPECT_TRUE(std::isfinite(g));
}

TEST(SoftmaxCrossEntropy, LabelOutsideTheClassesGivesNaN) {
  SoftmaxCrossEntropy loss;
  test::OpCheck check(test::context(), loss, {{3, 2}, {3}}, 1, {DType::f32, DType::u32});
  check.inputs[1] = {0.0f, 2.0f, 1.0f};
  check.tensors[0] = {1.0f, 1.0f};
  auto l = check.forward();
  EXPECT_TRUE(std::isnan(l[1]));
}

TEST(SoftmaxCrossEntropy, BackwardMatchesCpuWithClassWeights) {
  SoftmaxCrossEntropy loss;
  test::OpCheck check(test::context(), loss, {{11, 7}, {11}}, 3, {DType::f32, DType::u32});
  set_labels(check, 7);
  for (auto& x : check.inputs[0]) x *= 3;
  std::vector<float> dloss = test::random_values(11, 5, 0.5f, 2.0f);
  const std::vector<float> weights = {1.0f, 0.5f, 2.0f, 3.0f, 0.25f, 1.5f, 0.75f}, uniform(7, 1.0f);
  check.tensors[0] = weights;
  auto weighted = check.backward(dloss)[0];
  auto expected = cross_entropy_grad_cpu(check.inputs[0], check.inputs[1], weights, dloss);
  test::expect_near(weighted, expected, 1e-5, "weighted cross-entropy gradient");
  // The weights change the gradient: a backward that ignored them would fail above.
  auto unweighted = cross_entropy_grad_cpu(check.inputs[0], check.inputs[1], uniform, dloss);
  double largest_change = 0;
  for (size_t i = 0; i < expected.size(); ++i)
    largest_change = std::max(largest_change, std::abs(static_cast<double>(expected[i] - unweighted[i])));
  EXPECT_GT(largest_change, 0.01);
}

TEST(SoftmaxCrossEntropy, BackwardMatchesFiniteDifferences) {
  SoftmaxCrossEntropy loss;
  test::OpCheck check(test::context(), loss, {{11, 7}, {11}}, 3, {DType::f32, DType::u32});
  set_labels(check, 7);
  for (auto& x : check.inputs[0]) x *= 3;
  check.tensors[0] = {1.0f, 0.5f, 2.0f, 3.0f, 0.25f, 1.5f, 0.75f};
  check.expect_gradients_match(1e-2, 1e-2, 40);
}

// The trainer's running metrics: metrics_accumulate adds the first `valid` samples' summed
// -log softmax, correct predictions and count, summed within subgroups first or through shared
// memory alone (op.h's reduction_kernel), over more samples than its 64 invocations.
TEST(SoftmaxCrossEntropy, MetricsSumTheLossWithEitherReduction) {
  vk::Context& context = test::context();
  const uint32_t samples = 150, valid = 139, classes = 7;
  auto logits = test::random_values(samples * classes, 12, -4, 4);
  std::vector<uint32_t> labels(samples);
  for (uint32_t n = 0; n < samples; ++n) labels[n] = (n * 5 + 3) % classes;
  for (const vk::TileTarget& target : test::reduction_targets(context))
    for (DType dtype : {DType::f32, DType::f16}) {
      SCOPED_TRACE(test::describe(target) + (dtype == DType::f16 ? ", fp16" : ", fp32"));
      test::TileTargetScope scope(context, target);
      if (dtype == DType::f16) logits = from_half(to_half(logits));
      double loss = 0, correct = 0;
      for (uint32_t n = 0; n < valid; ++n) {
        const float* row = logits.data() + n * classes;
        double sum = 0;
        for (uint32_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c]));
        loss += std::log(sum) - row[labels[n]];
        correct += std::max_element(row, row + classes) - row == labels[n] ? 1 : 0;
      }
      Tensor t_logits(context, "logits", {samples, classes}, dtype), t_labels(context, "labels", {samples}, DType::u32),
          t_valid(context, "valid", {1}, DType::u32), t_metrics(context, "metrics", {4});
      t_logits.upload(logits);
      t_labels.upload(labels.data(), samples * 4);
      t_valid.upload(&valid, 4);
      t_metrics.upload(std::vector<float>{1.0f, 2.0f, 3.0f, 0.0f});  // sums from earlier batches
      vk::Program program(context);
      {
        vk::Recorder recorder(context, program);
        auto& kernels = context.kernels();
        struct Push {
          uint32_t classes;
        };
        recorder.dispatch(
            kernel_for<Push>(kernels,
                             reduction_kernel(kernels, vk::kernel::metrics_accumulate, vk::kernel::metrics_accumulate_subgroup),
                             t_logits),
            {reads(t_logits), reads(t_labels), reads(t_valid), updates(t_metrics)}, Push{classes}, 1);
        recorder.finish();
      }
      program.run();
      auto metrics = t_metrics.download();
      EXPECT_NEAR(metrics[0], 1 + loss, 1e-5 * loss);
      EXPECT_EQ(metrics[1], 2 + correct);
      EXPECT_EQ(metrics[2], 3 + valid);
      EXPECT_GT(correct, 0);
    }
}

}  // namespace
}  // namespace tessera
