#include "compute/loss_scale.h"

#include "compute/op.h"

namespace tessera {

void LossScale::upload(const LossScaleState& values) const {
  std::array<float, 4> words{values.scale, values.growth_tracker, values.skipped_steps, values.found_inf};
  state_.upload(words);
}

LossScaleState LossScale::download() const {
  auto words = state_.download();
  return {words.at(0), words.at(1), words.at(2), words.at(3)};
}

void LossScale::record_loss_gradient(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& dloss,
                                     std::optional<float> weight) const {
  struct Push {
    uint32_t count;
    float weight;
    uint32_t per_sample;
  } push{static_cast<uint32_t>(dloss.count()), weight.value_or(0.0f), weight ? 0u : 1u};
  recorder.dispatch_elements(kernels.get<Push>(vk::kernel::loss_scale_gradient, {kElementwiseGroup}),
                             {reads(state_), weight ? writes(dloss) : updates(dloss)}, push, dloss.count(),
                             kElementwiseGroup);
}

void LossScale::record_check(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& grad) const {
  struct Push {
    uint32_t count;
  } push{static_cast<uint32_t>(grad.count())};
  recorder.dispatch_elements(kernels.get<Push>(vk::kernel::loss_scale_check, {kElementwiseGroup}), {reads(grad), updates(state_)},
                             push, grad.count(), kElementwiseGroup);
}

void LossScale::record_update(vk::Recorder& recorder, vk::Kernels& kernels) const {
  struct Push {
    float growth, backoff;
    uint32_t interval;
  } push{kGrowth, kBackoff, kGrowthInterval};
  recorder.dispatch(kernels.get<Push>(vk::kernel::loss_scale_update), {updates(state_)}, push, 1);
}

}  // namespace tessera
