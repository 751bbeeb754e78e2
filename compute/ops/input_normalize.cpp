#include "compute/ops/input_normalize.h"

namespace tessera {

namespace {
constexpr float kMean[3] = {0.485f, 0.456f, 0.406f};
constexpr float kStd[3] = {0.229f, 0.224f, 0.225f};

struct NormalizePush {
  uint32_t count, height, width, channels;
  float mean[4], inv_std[4];  // per channel for RGB; [0] for every channel otherwise
};
// Channels that are not RGB (a multiplex slide's) have no ImageNet statistics: [0, 1] to [-1, 1].
constexpr float kOtherMean = 0.5f, kOtherStd = 0.5f;
}  // namespace

std::unique_ptr<Op> make_input_normalize(const LayerConfig&) { return std::make_unique<InputNormalize>(); }

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
                     {rgb ? kMean[0] : kOtherMean, kMean[1], kMean[2], 0},
                     {1 / (rgb ? kStd[0] : kOtherStd), 1 / kStd[1], 1 / kStd[2], 0}};
  recorder.dispatch_elements(kernel_for<NormalizePush>(kernels, vk::kernel::input_normalize, input, {kElementwiseGroup}),
                             {reads(*t.inputs[0]), writes(input)}, push,
                             static_cast<uint64_t>(input.count()), kElementwiseGroup);
}

}  // namespace tessera
