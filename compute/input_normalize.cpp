#include "compute/input_normalize.h"

#include "compute/op.h"

namespace tessera {

namespace {
constexpr float kMean[3] = {0.485f, 0.456f, 0.406f};
constexpr float kStd[3] = {0.229f, 0.224f, 0.225f};

struct NormalizePush {
  uint32_t count, height, width, pad;
  float mean[4], inv_std[4];
};
}  // namespace

void record_input_normalize(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& images, const Tensor& input) {
  NormalizePush push{static_cast<uint32_t>(input.count()),
                     static_cast<uint32_t>(input.shape()[2]),
                     static_cast<uint32_t>(input.shape()[3]),
                     0,
                     {kMean[0], kMean[1], kMean[2], 0},
                     {1 / kStd[0], 1 / kStd[1], 1 / kStd[2], 0}};
  recorder.dispatch_elements(kernels.get("input_normalize", {kElementwiseGroup}),
                             {vk::reads(images.buffer()), vk::writes(input.buffer())}, push,
                             static_cast<uint64_t>(input.count()), kElementwiseGroup);
}

}  // namespace tessera
