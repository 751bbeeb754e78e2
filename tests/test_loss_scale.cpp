// Dynamic loss scaling (compute/loss_scale.h) on the device: GradScaler's rules for the scale,
// the non-finite check, and an optimizer that skips a step without a trace (Adam's bias
// correction included); and the device check behind --precision fp16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "compute/loss_scale.h"
#include "compute/network.h"
#include "compute/optimizer.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

std::vector<float> state_of(const LossScale& scale) {
  auto s = scale.download();
  return {s.scale, s.growth_tracker, s.skipped_steps, s.found_inf};
}

TEST(LossScale, FollowsGradScalerRules) {
  auto& context = test::context();
  Tensor state(context, "loss_scale", LossScale::shape()), grad(context, "grad", {7});
  LossScale scale(state);
  vk::Program program(context);
  {
    vk::Recorder recorder(context, program);
    scale.record_check(recorder, context.kernels(), grad);
    scale.record_update(recorder, context.kernels());
    recorder.finish();
  }
  std::vector<float> finite{1, -2, 3e4f, 0, 5, -6e-8f, 7};
  scale.upload({1024, LossScale::kGrowthInterval - 2, 3, 0});
  grad.upload(finite);
  program.run();
  EXPECT_EQ(state_of(scale), (std::vector<float>{1024, LossScale::kGrowthInterval - 1, 3, 0}));
  program.run();  // the 2000th clean step in a row doubles the scale
  EXPECT_EQ(state_of(scale), (std::vector<float>{2048, 0, 3, 0}));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    auto values = finite;
    values[4] = bad;
    grad.upload(values);
    float before = scale.download().scale;
    program.run();  // skipped: halved, tracker reset, counted, found_inf cleared for the next step
    auto after = scale.download();
    EXPECT_EQ(after.scale, before / 2) << bad;
    EXPECT_EQ(after.growth_tracker, 0) << bad;
    EXPECT_EQ(after.found_inf, 0) << bad;
  }
  EXPECT_EQ(scale.download().skipped_steps, 6);
}

TEST(LossScale, LossGradientIsTheScaleOverK) {
  auto& context = test::context();
  Tensor state(context, "loss_scale", LossScale::shape()), dloss(context, "dloss", {5});
  LossScale scale(state);
  scale.upload({65536});
  vk::Program program(context);
  {
    vk::Recorder recorder(context, program);
    scale.record_loss_gradient(recorder, context.kernels(), dloss, 0.25f);
    recorder.finish();
  }
  program.run();
  EXPECT_EQ(dloss.download(), std::vector<float>(5, 16384.0f));
}

// Adam over the gradients g1, (a step with an infinity: skipped), g2 under a loss scale of 2^10
// ends exactly where Adam over g1, g2 without scaling does: the skipped step changes neither the
// weights nor the moments nor the bias correction, and the gradient is divided by the scale.
TEST(LossScale, SkippedStepLeavesNoTraceInAdam) {
  auto& context = test::context();
  OptimizerConfig config;
  config.kind = "adam";
  config.lr = 0.01f;
  const std::vector<float> initial{0.5f, -1.0f, 2.0f};
  const std::vector<std::vector<float>> grads{{0.25f, -0.5f, 1.0f}, {0.125f, 0.75f, -0.5f}};
  const float loss_scale = 1024;
  auto run = [&](bool scaled) {
    auto optimizer = Optimizer::make(config);
    Shape shape{3};
    Tensor parameter(context, "p", shape), grad(context, "p.grad", shape), step(context, "step", {2}, DType::u32),
        state(context, "loss_scale", LossScale::shape());
    LossScale scale(state);
    std::vector<std::unique_ptr<Tensor>> moments;
    std::vector<const Tensor*> pointers;
    for (auto& spec : optimizer->state({"weight", shape})) {
      moments.push_back(std::make_unique<Tensor>(context, spec.name, spec.shape));
      moments.back()->upload(std::vector<float>(3, 0.0f));
      pointers.push_back(moments.back().get());
    }
    parameter.upload(initial);
    uint32_t zero[2] = {0, 0};
    step.upload(zero, sizeof zero);
    scale.upload({loss_scale});
    vk::Program program(context);
    {
      vk::Recorder recorder(context, program);
      if (scaled) scale.record_check(recorder, context.kernels(), grad);
      optimizer->record_update(recorder, context.kernels(), parameter, grad, pointers, step, scaled ? &state : nullptr);
      Optimizer::record_step_advance(recorder, context.kernels(), step);
      if (scaled) scale.record_update(recorder, context.kernels());
      recorder.finish();
    }
    auto upload_scaled = [&](const std::vector<float>& g, float factor) {
      std::vector<float> values;
      for (float v : g) values.push_back(v * factor);
      grad.upload(values);
    };
    upload_scaled(grads[0], scaled ? loss_scale : 1);
    program.run();
    if (scaled) {
      auto before = parameter.download();
      grad.upload(std::vector<float>{1.0f, std::numeric_limits<float>::infinity(), 1.0f});
      program.run();
      EXPECT_EQ(parameter.download(), before) << "a skipped step changed the weights";
      EXPECT_EQ(grad.download(), std::vector<float>(3, 0.0f)) << "a skipped step must still clear the gradient";
      // The scale halved: the next gradient comes scaled by the new one.
      EXPECT_EQ(scale.download().scale, loss_scale / 2);
    }
    upload_scaled(grads[1], scaled ? loss_scale / 2 : 1);
    program.run();
    std::vector<std::vector<float>> result{parameter.download()};
    for (auto& m : moments) result.push_back(m->download());
    return result;
  };
  auto plain = run(false), scaled = run(true);
  ASSERT_EQ(plain.size(), scaled.size());
  for (size_t i = 0; i < plain.size(); ++i)
    for (size_t j = 0; j < plain[i].size(); ++j) EXPECT_FLOAT_EQ(scaled[i][j], plain[i][j]) << i << "," << j;
}

TEST(LossScale, Fp16NeedsStorageOf16BitFloats) {
  vk::DeviceInfo device{};
  device.name = "an old GPU";
  device.fp16_storage = false;
  try {
    require_fp16_storage(device, "extract");
    FAIL() << "no error for a device without 16-bit storage";
  } catch (const UsageError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("extract --precision fp16"), std::string::npos) << message;
    EXPECT_NE(message.find("an old GPU"), std::string::npos) << message;
  }
  device.fp16_storage = true;
  EXPECT_NO_THROW(require_fp16_storage(device, "extract"));
  EXPECT_TRUE(test::context().info().fp16_storage) << "lavapipe stores fp16: the fp16 tests need it";
}

}  // namespace
}  // namespace tessera
