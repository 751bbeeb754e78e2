#include "compute/optimizer.h"

#include "common/error.h"

namespace tessera {

namespace {

TensorSpec like(const TensorSpec& parameter, const char* name) {
  return {name, parameter.shape, TensorRole::state, DType::f32, {Init::zeros}};
}

uint32_t count_of(const Tensor& parameter) { return static_cast<uint32_t>(parameter.count()); }

// The optimizer kernels' constants: the workgroup, and whether they read a loss scale.
std::vector<int32_t> constants(const Tensor* loss_scale) {
  return {static_cast<int32_t>(kElementwiseGroup), loss_scale ? 1 : 0};
}

// The loss scale's binding; without one the kernels leave it unread, so the parameter stands in.
vk::BufferArg scale_arg(const Tensor& parameter, const Tensor* loss_scale) {
  return vk::reads(loss_scale ? loss_scale->buffer() : parameter.buffer());
}

// p -= lr * (g + wd * p), or with momentum: buf = momentum * buf + (g + wd * p) and
// p -= lr * buf (nesterov: lr * (g + wd * p + momentum * buf)). A zero buffer makes the first
// step buf = g, as PyTorch's.
class Sgd : public Optimizer {
 public:
  explicit Sgd(const OptimizerConfig& config) : config_(config) {}

  std::vector<TensorSpec> state(const TensorSpec& parameter) const override {
    if (config_.momentum == 0) return {};
    return {like(parameter, "momentum_buffer")};
  }

  void record_update(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& parameter, const Tensor& grad,
                     const std::vector<const Tensor*>& state, const Tensor&,
                     const Tensor* loss_scale) override {
    struct Push {
      uint32_t count;
      float lr, momentum, weight_decay, grad_scale;
      uint32_t nesterov;
    } push{count_of(parameter), config_.lr, config_.momentum, config_.weight_decay, config_.grad_scale,
           config_.nesterov ? 1u : 0u};
    if (config_.momentum == 0) {
      recorder.dispatch_elements(kernels.get<Push>(vk::kernel::optimizer_sgd, constants(loss_scale)),
                                 {vk::updates(parameter.buffer()), vk::updates(grad.buffer()),
                                  scale_arg(parameter, loss_scale)},
                                 push,
                                 parameter.count(), kElementwiseGroup);
      return;
    }
    recorder.dispatch_elements(kernels.get<Push>(vk::kernel::optimizer_sgd_momentum, constants(loss_scale)),
                               {vk::updates(parameter.buffer()), vk::updates(grad.buffer()),
                                vk::updates(state.at(0)->buffer()), scale_arg(parameter, loss_scale)},
                               push, parameter.count(), kElementwiseGroup);
  }

 private:
  OptimizerConfig config_;
};

// Adam with L2 decay added to the gradient, or AdamW's decoupled decay p -= lr * wd * p;
// bias correction with t = step[0] + 1, read on the device.
class Adam : public Optimizer {
 public:
  Adam(const OptimizerConfig& config, bool decoupled) : config_(config), decoupled_(decoupled) {}

  std::vector<TensorSpec> state(const TensorSpec& parameter) const override {
    return {like(parameter, "exp_avg"), like(parameter, "exp_avg_sq")};
  }

  void record_update(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& parameter, const Tensor& grad,
                     const std::vector<const Tensor*>& state, const Tensor& step,
                     const Tensor* loss_scale) override {
    struct Push {
      uint32_t count;
      float lr, beta1, beta2, eps, weight_decay, grad_scale;
      uint32_t decoupled;
    } push{count_of(parameter), config_.lr,         config_.beta1, config_.beta2, config_.eps.value_or(1e-8f),
           config_.weight_decay, config_.grad_scale, decoupled_ ? 1u : 0u};
    recorder.dispatch_elements(kernels.get<Push>(vk::kernel::optimizer_adam, constants(loss_scale)),
                               {vk::updates(parameter.buffer()), vk::updates(grad.buffer()),
                                vk::updates(state.at(0)->buffer()), vk::updates(state.at(1)->buffer()),
                                vk::reads(step.buffer()), scale_arg(parameter, loss_scale)},
                               push, parameter.count(), kElementwiseGroup);
  }

 private:
  OptimizerConfig config_;
  bool decoupled_;
};

// sum += g^2; p -= lr * g / (sqrt(sum) + eps), with g = grad + wd * p.
class Adagrad : public Optimizer {
 public:
  explicit Adagrad(const OptimizerConfig& config) : config_(config) {}

  std::vector<TensorSpec> state(const TensorSpec& parameter) const override { return {like(parameter, "sum")}; }

  void record_update(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& parameter, const Tensor& grad,
                     const std::vector<const Tensor*>& state, const Tensor&,
                     const Tensor* loss_scale) override {
    struct Push {
      uint32_t count;
      float lr, eps, weight_decay, grad_scale;
    } push{count_of(parameter), config_.lr, config_.eps.value_or(1e-10f), config_.weight_decay, config_.grad_scale};
    recorder.dispatch_elements(kernels.get<Push>(vk::kernel::optimizer_adagrad, constants(loss_scale)),
                               {vk::updates(parameter.buffer()), vk::updates(grad.buffer()),
                                vk::updates(state.at(0)->buffer()), scale_arg(parameter, loss_scale)},
                               push, parameter.count(), kElementwiseGroup);
  }

 private:
  OptimizerConfig config_;
};

}  // namespace

std::unique_ptr<Optimizer> Optimizer::make(const OptimizerConfig& config) {
  if (config.kind == "sgd") {
    if (config.nesterov && config.momentum <= 0) throw UsageError("--nesterov needs --momentum above 0");
    return std::make_unique<Sgd>(config);
  }
  if (config.kind == "adam" || config.kind == "adamw") return std::make_unique<Adam>(config, config.kind == "adamw");
  if (config.kind == "adagrad") return std::make_unique<Adagrad>(config);
  throw UsageError("--optimizer: '" + config.kind + "' is not one of sgd, adam, adamw, adagrad");
}

void Optimizer::record_step_advance(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& step) {
  recorder.dispatch(kernels.get(vk::kernel::optimizer_step), {vk::updates(step.buffer())}, 1);
}

}  // namespace tessera
