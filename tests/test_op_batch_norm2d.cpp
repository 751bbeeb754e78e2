// Batch norm: training and evaluation forward and training backward against the CPU in double,
// with the channel sums over subgroups first and through shared memory alone (both reduction
// variants), in fp32 and fp16; running statistics as PyTorch updates them, central differences
// in both modes and on [N,C], and the backward variant without an input gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "compute/ops/batch_norm2d.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

std::unique_ptr<Op> make() { return make_batch_norm2d(LayerConfig({{"name", "bn1"}, {"type", "batch_norm2d"}})); }

// Enough elements a channel that a GPU's training passes split each channel into slices (the
// last one shorter), merged into the channel's statistics and sums.
const Shape kSliced{4, 3, 61, 67};

struct Statistics {
  std::vector<double> mean, variance;  // biased variance
};

// x [N,C,H,W] -> per-channel mean and variance
Statistics statistics_cpu(const std::vector<float>& x, const Shape& shape) {
  int64_t channels = shape[1], plane = element_count(shape) / (shape[0] * channels);
  Statistics s{std::vector<double>(static_cast<size_t>(channels)), std::vector<double>(static_cast<size_t>(channels))};
  double count = static_cast<double>(shape[0] * plane);
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t n = 0; n < shape[0]; ++n)
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t i = 0; i < plane; ++i) {
          double v = x[static_cast<size_t>((n * channels + c) * plane + i)];
          auto cc = static_cast<size_t>(c);
          if (pass == 0)
            s.mean[cc] += v / count;
          else
            s.variance[cc] += (v - s.mean[cc]) * (v - s.mean[cc]) / count;
        }
  return s;
}

// y = (x - mean) / sqrt(variance + eps) * weight + bias
std::vector<float> normalize_cpu(const std::vector<float>& x, const Shape& shape, const std::vector<double>& mean,
                                 const std::vector<double>& variance, const std::vector<float>& weight,
                                 const std::vector<float>& bias) {
  int64_t channels = shape[1], plane = element_count(shape) / (shape[0] * channels);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    auto c = static_cast<size_t>((static_cast<int64_t>(i) / plane) % channels);
    y[i] = static_cast<float>((x[i] - mean[c]) / std::sqrt(variance[c] + 1e-5) * weight[c] + bias[c]);
  }
  return y;
}

// The reduction variant from each reference device's properties (never its name): subgroup
// sums on GPUs with subgroup arithmetic; lavapipe, as whatever type, keeps the shared-memory
// tree, faster there.
TEST(BatchNorm2d, ReductionVariantFollowsTheDevicesProperties) {
  std::map<std::string, bool> subgroup = {
      {"NVIDIA H100 (NVIDIA driver)", true}, {"AMD RDNA3, wave64 (RADV)", true},
      {"AMD RDNA2, wave32", true},           {"Intel Xe (ANV)", true},
      {"Apple M1 (MoltenVK)", true},         {"lavapipe", false},
      {"lavapipe presented as a discrete GPU", false}, {"Vulkan's minimum limits, subgroups of 32", false},
  };
  for (const test::ReferenceDevice& device : test::reference_devices()) {
    SCOPED_TRACE(device.name);
    ASSERT_TRUE(subgroup.count(device.name));
    EXPECT_EQ(subgroup_reductions(device.target), subgroup[device.name]);
  }
}

TEST(BatchNorm2d, RejectsOtherRanks) {
  EXPECT_THROW(make()->infer({{2, 3, 4}}), ShapeError);
  EXPECT_THROW(make_batch_norm2d(LayerConfig({{"name", "bn"}, {"type", "batch_norm2d"}, {"eps", 0}})), ModelError);
}

TEST(BatchNorm2d, TrainingForwardMatchesCpu) {
  for (const vk::TileTarget& target : test::reduction_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    for (DType activations : {DType::f32, DType::f16})
      for (Shape shape : {Shape{3, 4, 5, 7}, Shape{5, 6}, Shape{2, 3, 33, 17}, kSliced}) {
        auto op = make();
        test::OpCheck check(test::context(), *op, {shape}, 4, {}, {}, activations);
        for (auto& x : check.inputs[0]) x = 3 * x + 5;  // a mean far from zero
        if (activations == DType::f16) check.inputs[0] = from_half(to_half(check.inputs[0]));
        auto s = statistics_cpu(check.inputs[0], shape);
        test::expect_near(check.forward(),
                          normalize_cpu(check.inputs[0], shape, s.mean, s.variance, check.tensors[0], check.tensors[1]),
                          activations == DType::f16 ? 1.0 / 1024 : 1e-4, "batch norm in training");
      }
  }
}

// dx = weight invstd (dy - (sum dy + xhat sum dy xhat) / count), dweight = sum dy xhat,
// dbias = sum dy, per channel, in double; fp16 stores x, y, dy and dx.
TEST(BatchNorm2d, TrainingBackwardMatchesCpu) {
  for (const vk::TileTarget& target : test::reduction_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    for (DType activations : {DType::f32, DType::f16})
      for (Shape shape : {Shape{3, 4, 5, 7}, Shape{9, 5}, Shape{2, 3, 33, 17}, kSliced}) {
        auto op = make();
        test::OpCheck check(test::context(), *op, {shape}, 6, {}, {}, activations);
        auto dy = test::random_values(check.inputs[0].size(), 10);
        if (activations == DType::f16) dy = from_half(to_half(dy));
        auto grads = check.backward(dy);
        const auto& x = check.inputs[0];
        auto s = statistics_cpu(x, shape);
        int64_t channels = shape[1], plane = element_count(shape) / (shape[0] * channels);
        auto channel = [&](size_t i) { return static_cast<size_t>(static_cast<int64_t>(i) / plane % channels); };
        auto xhat = [&](size_t i) { return (x[i] - s.mean[channel(i)]) / std::sqrt(s.variance[channel(i)] + 1e-5); };
        std::vector<double> sum_dy(static_cast<size_t>(channels)), sum_dy_xhat(static_cast<size_t>(channels));
        for (size_t i = 0; i < x.size(); ++i) {
          sum_dy[channel(i)] += dy[i];
          sum_dy_xhat[channel(i)] += dy[i] * xhat(i);
        }
        double count = static_cast<double>(shape[0] * plane);
        std::vector<float> dx(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          size_t c = channel(i);
          dx[i] = static_cast<float>(check.tensors[0][c] / std::sqrt(s.variance[c] + 1e-5) *
                                     (dy[i] - (sum_dy[c] + xhat(i) * sum_dy_xhat[c]) / count));
        }
        test::expect_near(grads[0], dx, activations == DType::f16 ? 1.0 / 1024 : 1e-4, "dx");
        test::expect_near(grads[1], std::vector<float>(sum_dy_xhat.begin(), sum_dy_xhat.end()), 1e-4, "dweight");
        test::expect_near(grads[2], std::vector<float>(sum_dy.begin(), sum_dy.end()), 1e-4, "dbias");
      }
  }
}

TEST(BatchNorm2d, EvaluationForwardUsesRunningStatistics) {
  auto op = make();
  Shape shape{3, 4, 5, 7};
  test::OpCheck check(test::context(), *op, {shape}, 5);
  check.training = false;
  check.tensors[2] = {0.5f, -1.0f, 0.25f, 2.0f};
  check.tensors[3] = {1.5f, 0.5f, 2.0f, 0.1f};
  std::vector<double> mean(check.tensors[2].begin(), check.tensors[2].end()),
      variance(check.tensors[3].begin(), check.tensors[3].end());
  test::expect_near(check.forward(),
                    normalize_cpu(check.inputs[0], shape, mean, variance, check.tensors[0], check.tensors[1]), 1e-5,
                    "batch norm in evaluation");
}

// Forward and backward in one run, for what the gradient check does not show: the state
// after forward, and backward without an input gradient.
struct DirectRun {
  std::vector<std::vector<float>> tensors, grads;  // after the run
  std::vector<float> input_grad;
};
DirectRun run_direct(Op& op, const Shape& shape, const std::vector<float>& x, bool with_input_grad) {
  test::OpCheck check(test::context(), op, {shape}, 1, {}, {with_input_grad});
  check.inputs[0] = x;
  auto grads = check.backward(test::random_values(x.size(), 9));
  DirectRun result;
  for (size_t s = 0; s < check.specs.size(); ++s) result.tensors.push_back(check.tensor_after_run(s));
  result.input_grad = grads[0];
  result.grads.assign(grads.begin() + 1, grads.end());
  return result;
}

TEST(BatchNorm2d, RunningStatisticsMoveByMomentumWithUnbiasedVariance) {
  for (const vk::TileTarget& target : test::reduction_targets(test::context()))
    for (Shape shape : {Shape{3, 4, 5, 7}, kSliced}) {
      SCOPED_TRACE(test::describe(target) + " " + to_string(shape));
      test::TileTargetScope scope(test::context(), target);
      auto op = make();
      auto x = test::random_values(static_cast<size_t>(element_count(shape)), 6, 1, 4);
      auto s = statistics_cpu(x, shape);
      auto run = run_direct(*op, shape, x, true);
      auto channels = static_cast<size_t>(shape[1]);
      double count = static_cast<double>(element_count(shape)) / static_cast<double>(channels);
      std::vector<float> mean(channels), var(channels);
      for (size_t c = 0; c < channels; ++c) {
        mean[c] = static_cast<float>(0.1 * s.mean[c]);
        var[c] = static_cast<float>(0.9 + 0.1 * s.variance[c] * count / (count - 1));
      }
      test::expect_near(run.tensors[2], mean, 1e-5, "running_mean");
      test::expect_near(run.tensors[3], var, 1e-5, "running_var");
    }
}

TEST(BatchNorm2d, ParameterGradientsWithoutInputGradient) {
  for (const vk::TileTarget& target : test::reduction_targets(test::context())) {
    SCOPED_TRACE(test::describe(target));
    test::TileTargetScope scope(test::context(), target);
    for (Shape shape : {Shape{2, 3, 5, 5}, kSliced}) {
      auto op = make();
      auto x = test::random_values(static_cast<size_t>(element_count(shape)), 7);
      auto with = run_direct(*op, shape, x, true), without = run_direct(*op, shape, x, false);
      test::expect_near(without.grads[0], with.grads[0], 1e-6, "dweight");
      test::expect_near(without.grads[1], with.grads[1], 1e-6, "dbias");
    }
  }
}

TEST(BatchNorm2d, TrainingBackwardMatchesFiniteDifferences) {
  for (Shape shape : {Shape{3, 2, 5, 7}, Shape{7, 3}}) {
    auto op = make();
    test::OpCheck check(test::context(), *op, {shape}, 8);
    check.expect_gradients_match(1e-2, 2e-2, 32);
  }
}

TEST(BatchNorm2d, EvaluationBackwardMatchesFiniteDifferences) {
  auto op = make();
  test::OpCheck check(test::context(), *op, {{2, 3, 5, 7}}, 9);
  check.training = false;
  check.tensors[2] = {0.5f, -1.0f, 0.25f};
  check.tensors[3] = {1.5f, 0.5f, 2.0f};
  check.expect_gradients_match(1e-2, 2e-2, 32);
}

}  // namespace
}  // namespace tessera
