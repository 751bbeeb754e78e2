#include "compute/ops/input_normalize.h"

#include <algorithm>

#include "common/json_input.h"

namespace tessera {

namespace {

struct NormalizePush {
  uint32_t count, height, width, channels;
  float mean[4], inv_std[4];  // per channel for RGB; [0] for every channel otherwise
};
// Channels that are not RGB (a multiplex slide's) have no ImageNet statistics: [0, 1] to [-1, 1].
constexpr float kOtherMean = 0.5f, kOtherStd = 0.5f;
// Bounds of the normalisation constants (read_normalisation).
constexpr double kMaxMean = 1000, kMinStd = 1e-3, kMaxStd = 1000;
}  // namespace

Normalisation read_normalisation(const LayerConfig& layer) {
  Normalisation read{layer.numbers("mean", {0.485, 0.456, 0.406}), layer.numbers("std", {0.229, 0.224, 0.225})};
  auto within = [](double low, double high) { return [=](double value) { return value >= low && value <= high; }; };
  if (!std::all_of(read.mean.begin(), read.mean.end(), within(-kMaxMean, kMaxMean)))
    layer.fail("mean", "must hold numbers from -1000 to 1000, got " + json_excerpt(read.mean));
  if (!std::all_of(read.std.begin(), read.std.end(), within(kMinStd, kMaxStd)))
    layer.fail("std", "must hold numbers from 0.001 to 1000, got " + json_excerpt(read.std));
  return read;
}

std::unique_ptr<Op> make_input_normalize(const LayerConfig& layer) {
  Normalisation normalisation = read_normalisation(layer);
  return std::make_unique<InputNormalize>(std::move(normalisation.mean), std::move(normalisation.std));
}

Shape InputNormalize::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 4 || inputs[0][3] < 1)
    throw ShapeError("input_normalize takes images [N,H,W,C], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])));
  return {inputs[0][0], inputs[0][3], inputs[0][1], inputs[0][2]};
}

void InputNormalize::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Tensor& input = *t.output;
  auto channels = static_cast<uint32_t>(input.shape()[1]);
  bool rgb = channels == 3;
  NormalizePush push{static_cast<uint32_t>(input.count()),
                     static_cast<uint32_t>(input.shape()[2]),
                     static_cast<uint32_t>(input.shape()[3]),
                     channels,
                     {rgb ? static_cast<float>(mean_[0]) : kOtherMean, static_cast<float>(mean_[1]),
                      static_cast<float>(mean_[2]), 0},
                     {1 / (rgb ? static_cast<float>(std_[0]) : kOtherStd), 1 / static_cast<float>(std_[1]),
                      1 / static_cast<float>(std_[2]), 0}};
  recorder.dispatch_elements(kernel_for<NormalizePush>(kernels, vk::kernel::input_normalize, input, {kElementwiseGroup}),
                             {reads(*t.inputs[0]), writes(input)}, push,
                             static_cast<uint64_t>(input.count()), kElementwiseGroup);
}

}  // namespace tessera
