// Optimizers against a CPU reference in double over several steps, and against values that
// torch.optim 1.13 produced for the same parameters and gradients (tools-free: constants).
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "compute/optimizer.h"
#include "compute/vk/recorder.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Trajectory {
  std::vector<float> parameter, grad;  // after the last step
  std::vector<std::vector<float>> state;
  uint32_t step = 0;
};

// Records one update and the step advance once, then replays it with the gradients of each
// step uploaded in between, as the trainer does.
Trajectory run_device(const OptimizerConfig& config, const std::vector<float>& initial,
                      const std::vector<std::vector<float>>& grads) {
  auto& context = test::context();
  auto optimizer = Optimizer::make(config);
  Shape shape{static_cast<int64_t>(initial.size())};
  Tensor parameter(context, "p", shape), grad(context, "p.grad", shape), step(context, "step", {2}, DType::u32);
  std::vector<std::unique_ptr<Tensor>> state;
  std::vector<const Tensor*> state_pointers;
  for (auto& spec : optimizer->state({"weight", shape})) {
    EXPECT_EQ(spec.shape, shape);
    state.push_back(std::make_unique<Tensor>(context, spec.name, spec.shape));
    state.back()->upload(std::vector<float>(initial.size(), 0.0f));
    state_pointers.push_back(state.back().get());
  }
  parameter.upload(initial);
  uint32_t zero[2] = {0, 0};
  step.upload(zero, sizeof zero);
  vk::Program program(context);
  {
    vk::Recorder recorder(context, program);
    optimizer->record_update(recorder, context.kernels(), parameter, grad, state_pointers, step);
    Optimizer::record_step_advance(recorder, context.kernels(), step);
    recorder.finish();
  }
  for (auto& g : grads) {
    grad.upload(g);
    program.run();
  }
  Trajectory result{parameter.download(), grad.download(), {}, 0};
  for (auto& s : state) result.state.push_back(s->download());
  uint32_t steps[2];
  step.download(steps, sizeof steps);
  result.step = steps[0];
  return result;
}

// PyTorch's update rules, written out in double.
std::vector<double> run_cpu(const OptimizerConfig& c, const std::vector<float>& initial,
                            const std::vector<std::vector<float>>& grads) {
  std::vector<double> p(initial.begin(), initial.end()), a(p.size(), 0.0), b(p.size(), 0.0);
  for (size_t t = 1; t <= grads.size(); ++t)
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grads[t - 1][i] * static_cast<double>(c.grad_scale);
      if (c.kind == "sgd") {
        g += c.weight_decay * p[i];
        a[i] = c.momentum * a[i] + g;
        p[i] -= c.lr * (c.momentum == 0 ? g : c.nesterov ? g + c.momentum * a[i] : a[i]);
      } else if (c.kind == "adam" || c.kind == "adamw") {
        if (c.kind == "adamw")
          p[i] *= 1 - static_cast<double>(c.lr) * c.weight_decay;
        else
          g += c.weight_decay * p[i];
        a[i] = c.beta1 * a[i] + (1 - static_cast<double>(c.beta1)) * g;
        b[i] = c.beta2 * b[i] + (1 - static_cast<double>(c.beta2)) * g * g;
        double correction1 = 1 - std::pow(static_cast<double>(c.beta1), static_cast<double>(t));
        double correction2 = 1 - std::pow(static_cast<double>(c.beta2), static_cast<double>(t));
        p[i] -= c.lr / correction1 * a[i] / (std::sqrt(b[i]) / std::sqrt(correction2) + c.eps.value_or(1e-8f));
      } else {
        g += c.weight_decay * p[i];
        a[i] += g * g;
        p[i] -= c.lr * g / (std::sqrt(a[i]) + c.eps.value_or(1e-10f));
      }
    }
  return p;
}

OptimizerConfig config(std::string kind, float lr, float momentum = 0, float weight_decay = 0, bool nesterov = false,
                       float grad_scale = 1) {
  OptimizerConfig c;
  c.kind = std::move(kind);
  c.lr = lr;
  c.momentum = momentum;
  c.weight_decay = weight_decay;
  c.nesterov = nesterov;
  c.grad_scale = grad_scale;
  return c;
}

TEST(Optimizer, UnknownKindNamesTheFlag) {
  try {
    Optimizer::make(config("lbfgs", 0.1f));
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--optimizer"), std::string::npos) << e.what();
  }
}

TEST(Optimizer, StateFollowsPyTorchNames) {
  TensorSpec weight{"weight", {3, 4}};
  auto names = [&](const OptimizerConfig& c) {
    std::vector<std::string> result;
    for (auto& spec : Optimizer::make(c)->state(weight)) result.push_back(spec.name);
    return result;
  };
  EXPECT_TRUE(names(config("sgd", 0.1f)).empty());
  EXPECT_EQ(names(config("sgd", 0.1f, 0.9f)), std::vector<std::string>{"momentum_buffer"});
  EXPECT_EQ(names(config("adam", 0.1f)), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(names(config("adamw", 0.1f)), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(names(config("adagrad", 0.1f)), std::vector<std::string>{"sum"});
}

TEST(Optimizer, MatchesCpuReferenceOverSteps) {
  const OptimizerConfig configs[] = {
      config("sgd", 0.05f, 0, 0.01f),      config("sgd", 0.05f, 0.9f, 0.01f, false, 0.5f),
      config("sgd", 0.05f, 0.8f, 0, true), config("adam", 0.01f, 0, 0.05f),
      config("adamw", 0.01f, 0, 0.05f, false, 0.25f), config("adagrad", 0.1f, 0, 0.01f),
  };
  auto initial = test::random_values(301, 1);
  std::vector<std::vector<float>> grads;
  for (uint32_t t = 0; t < 6; ++t) grads.push_back(test::random_values(301, 10 + t, -2, 2));
  for (auto& c : configs) {
    SCOPED_TRACE(c.kind + " momentum " + std::to_string(c.momentum) + " nesterov " + std::to_string(c.nesterov));
    auto device = run_device(c, initial, grads);
    auto expected = run_cpu(c, initial, grads);
    test::expect_near(device.parameter, std::vector<float>(expected.begin(), expected.end()), 2e-5, "parameter");
    test::expect_near(device.grad, std::vector<float>(initial.size(), 0.0f), 0, "gradient after the update");
    EXPECT_EQ(device.step, 6u);
  }
}

// A parameter of more than 32768 workgroups of 256 elements: the dispatch spreads over y, which
// once overlapped rows and left most elements out (global_index() saw a workgroup size of 1):
// small-cnn's fc1 on 256 px tiles (128 x 262144) kept most of its weights and gradients, and two
// runs differed where rows raced. Every element must take exactly the one update.
TEST(Optimizer, UpdatesEveryElementOfAParameterOverManyWorkgroups) {
  const size_t count = size_t{128} * 131072;
  std::vector<float> initial(count), grad(count);
  for (size_t i = 0; i < count; ++i) {
    initial[i] = static_cast<float>(i % 1000) * 0.001f;
    grad[i] = 1.0f + static_cast<float>(i % 7);
  }
  auto c = config("sgd", 0.5f, 0.9f);
  auto device = run_device(c, initial, {grad});
  size_t wrong = 0, first_wrong = count;
  for (size_t i = 0; i < count; ++i) {
    float expected = initial[i] - 0.5f * grad[i];
    bool ok = device.parameter[i] == expected && device.grad[i] == 0.0f && device.state[0][i] == grad[i];
    if (!ok && wrong++ == 0) first_wrong = i;
  }
  EXPECT_EQ(wrong, 0u) << "elements without their one update, the first at " << first_wrong;
}

TEST(Optimizer, MatchesTorchOptim) {
  // torch.optim 1.13, five steps from these parameters with grad[i] at step t =
  // sin(1 + i + 1.3 t) * (1 + i % 3), times the gradient scale.
  const std::vector<float> initial{0.5f, -1.0f, 2.0f, -0.25f, 0.0f, 1.5f};
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 5; ++t) {
    grads.emplace_back();
    for (int i = 0; i < 6; ++i) grads.back().push_back(static_cast<float>(std::sin(1.0 + i + 1.3 * t) * (1 + i % 3)));
  }
  struct Case {
    OptimizerConfig config;
    std::vector<float> torch;
  };
  const Case cases[] = {
      {config("sgd", 0.1f), {0.492088646f, -1.03553045f, 1.96614265f, -0.244430259f, 0.0346089192f, 1.53938854f}},
      {config("sgd", 0.1f, 0, 0.1f, false, 0.5f),
       {0.473373085f, -0.967992008f, 1.88078725f, -0.236880198f, 0.0160030331f, 1.44982255f}},
      {config("sgd", 0.1f, 0.9f, 0.01f),
       {0.209152997f, -1.09919631f, 2.6446023f, 0.0510664135f, 0.196363628f, 0.905252934f}},
      {config("sgd", 0.1f, 0.9f, 0, true),
       {0.23456192f, -1.13841403f, 2.57195807f, 0.0252271611f, 0.213518217f, 1.02041149f}},
      {config("adam", 0.01f, 0, 0.1f),
       {0.474845886f, -1.00832915f, 2.00243473f, -0.224534094f, 0.0131035382f, 1.49366784f}},
      {config("adamw", 0.01f, 0, 0.1f, false, 0.25f),
       {0.47423321f, -1.00583088f, 1.99560058f, -0.224223018f, 0.0130724069f, 1.48852205f}},
      {config("adagrad", 0.1f, 0, 0.01f),
       {0.437744617f, -1.03058422f, 1.94811165f, -0.181775793f, 0.0360494927f, 1.53900814f}},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.config.kind);
    test::expect_near(run_device(c.config, initial, grads).parameter, c.torch, 1e-5, "parameter vs torch.optim");
  }
}

}  // namespace
}  // namespace tessera
