// Dynamic loss scaling for mixed precision, with PyTorch GradScaler's rules and defaults: the
// loss gradient is multiplied by the scale (from 65536) so that small gradients survive fp16;
// after backward every parameter gradient is checked for NaN and infinities; the optimizer
// divides by the scale and skips the step where one was found; the scale then halves, or
// doubles after 2000 clean steps in a row. All of it stays on the device, in a float [4]
// state (scale, growth tracker, skipped steps, found_inf), so that a whole step is still
// recorded once and replayed; the host reads the state only to report and checkpoint it.
#pragma once
#include <array>
#include <optional>

#include "compute/tensor.h"
#include "compute/vk/kernels.h"
#include "compute/vk/recorder.h"

namespace tessera {

struct LossScaleState {
  float scale = 65536.0f;
  float growth_tracker = 0;  // clean steps since the scale last changed
  float skipped_steps = 0;   // over the whole run
  float found_inf = 0;       // within a step; 0 between steps
};

class LossScale {
 public:
  static constexpr float kGrowth = 2.0f, kBackoff = 0.5f;
  static constexpr uint32_t kGrowthInterval = 2000;

  // `state` is the float [4] tensor that holds a LossScaleState.
  explicit LossScale(const Tensor& state) : state_(state) {}
  static Shape shape() { return {4}; }
  void upload(const LossScaleState& values) const;
  LossScaleState download() const;

  // dloss = weight * scale for every sample: the gradient backward starts from. Without a
  // weight, dloss *= scale: the per-sample weights a data-parallel replica was given.
  void record_loss_gradient(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& dloss,
                            std::optional<float> weight) const;
  // found_inf |= any gradient value is not finite; once per parameter after backward.
  void record_check(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& grad) const;
  // After the optimizer: the scale's next value (see loss_scale_update.comp).
  void record_update(vk::Recorder& recorder, vk::Kernels& kernels) const;

 private:
  const Tensor& state_;
};

}  // namespace tessera
