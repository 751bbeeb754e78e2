// Parameter updates recorded into the training step's command buffer: SGD, Adam, AdamW and
// Adagrad with PyTorch's semantics, so that the same settings train the same way.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compute/op.h"

namespace tessera {

struct OptimizerConfig {
  std::string kind = "sgd";  // sgd, adam, adamw, adagrad
  float lr = 0.01f;
  float momentum = 0;        // sgd
  bool nesterov = false;     // sgd, with momentum
  float weight_decay = 0;    // L2 added to the gradient; decoupled (p -= lr * wd * p) for adamw
  float beta1 = 0.9f, beta2 = 0.999f;  // adam, adamw
  std::optional<float> eps;  // default as in PyTorch: 1e-8 for adam and adamw, 1e-10 for adagrad
  float grad_scale = 1;      // gradients are multiplied by this before use
};

class Optimizer {
 public:
  // Throws UsageError naming --optimizer for an unknown kind.
  static std::unique_ptr<Optimizer> make(const OptimizerConfig& config);
  virtual ~Optimizer() = default;

  // The per-parameter state ("momentum_buffer", "exp_avg", "exp_avg_sq", "sum"), shaped like
  // the parameter and starting at zero; the trainer allocates it and checkpoints it.
  virtual std::vector<TensorSpec> state(const TensorSpec& parameter) const = 0;

  // Records one update of `parameter` from grad * grad_scale, then zeroes `grad`. `state`
  // holds the tensors of state(), in order; `step` is the u32 [2] step count (read by Adam's
  // bias correction as t = step[0] + 1). With `loss_scale` (mixed precision, see
  // loss_scale.h) the gradient is divided by the loss scale, and the update is skipped where
  // the step found a non-finite gradient.
  virtual void record_update(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& parameter,
                             const Tensor& grad, const std::vector<const Tensor*>& state, const Tensor& step,
                             const Tensor* loss_scale = nullptr) = 0;

  // Records step[0] += 1; the trainer records it once, after every parameter's update.
  static void record_step_advance(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& step);
};

}  // namespace tessera
