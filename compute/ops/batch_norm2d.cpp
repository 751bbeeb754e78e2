#include "compute/ops/batch_norm2d.h"

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
// The workgroup that reduces one channel: a power of two (shaders/reduce.glsl).
constexpr uint32_t kChannelGroup = 256;

enum Slot : size_t { weight, bias, running_mean, running_var, mean, invstd };

struct ForwardPush {
  uint32_t batch, channels, plane;
  float eps, momentum;
  uint32_t training;
};
struct BackwardPush {
  uint32_t batch, channels, plane, training, accumulate;
};
}  // namespace

std::unique_ptr<Op> make_batch_norm2d(const LayerConfig& layer) {
  double eps = layer.number("eps", 1e-5), momentum = layer.number("momentum", 0.1);
  if (!(eps > 0)) layer.fail("eps", "must be above 0");
  if (!(momentum >= 0 && momentum <= 1)) layer.fail("momentum", "must be in [0, 1]");
  return std::make_unique<BatchNorm2d>(static_cast<float>(eps), static_cast<float>(momentum));
}

Shape BatchNorm2d::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || (inputs[0].size() != 4 && inputs[0].size() != 2))
    throw ShapeError("batch_norm2d takes one [N,C,H,W] or [N,C] input, got " +
                     (inputs.empty() ? std::string("none") : to_string(inputs[0])));
  batch_ = inputs[0][0];
  channels_ = inputs[0][1];
  plane_ = inputs[0].size() == 4 ? inputs[0][2] * inputs[0][3] : 1;
  return inputs[0];
}

std::vector<TensorSpec> BatchNorm2d::tensors() const {
  Shape c{channels_};
  return {{"weight", c, TensorRole::parameter, DType::f32, {Init::ones}},
          {"bias", c, TensorRole::parameter, DType::f32, {Init::zeros}},
          {"running_mean", c, TensorRole::state, DType::f32, {Init::zeros}},
          {"running_var", c, TensorRole::state, DType::f32, {Init::ones}},
          {"mean", c, TensorRole::saved},
          {"invstd", c, TensorRole::saved}};
}

void BatchNorm2d::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto running = [&](size_t slot) {
    const vk::Buffer& b = t.tensors[slot]->buffer();
    return t.training ? vk::updates(b) : vk::reads(b);
  };
  ForwardPush push{static_cast<uint32_t>(batch_), static_cast<uint32_t>(channels_), static_cast<uint32_t>(plane_),
                   eps_, momentum_, t.training ? 1u : 0u};
  recorder.dispatch(kernels.get("batch_norm2d_forward", {kChannelGroup, t.relu ? 1 : 0}),
                    {vk::reads(t.inputs[0]->buffer()), vk::reads(t.tensors[weight]->buffer()),
                     vk::reads(t.tensors[bias]->buffer()), running(running_mean), running(running_var),
                     vk::writes(t.tensors[mean]->buffer()), vk::writes(t.tensors[invstd]->buffer()),
                     vk::writes(t.output->buffer())},
                    push, static_cast<uint32_t>(channels_));
}

void BatchNorm2d::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  bool input_grad = t.input_grads[0] != nullptr;
  BackwardPush push{static_cast<uint32_t>(batch_), static_cast<uint32_t>(channels_), static_cast<uint32_t>(plane_),
                    t.training ? 1u : 0u, input_grad ? accumulates(t, 0) : 0u};
  auto x = vk::reads(t.inputs[0]->buffer()), w = vk::reads(t.tensors[weight]->buffer()),
       m = vk::reads(t.tensors[mean]->buffer()), s = vk::reads(t.tensors[invstd]->buffer()),
       dy = vk::reads(t.output_grad->buffer()), dw = vk::updates(t.grads[weight]->buffer()),
       db = vk::updates(t.grads[bias]->buffer()), y = vk::reads(t.output->buffer());
  auto groups = static_cast<uint32_t>(channels_);
  std::vector<int32_t> constants{static_cast<int32_t>(kChannelGroup), t.relu ? 1 : 0};
  if (input_grad)
    recorder.dispatch(kernels.get("batch_norm2d_backward", constants), {x, w, m, s, dy, dw, db, y, input_grad_arg(t, 0)},
                      push, groups);
  else
    recorder.dispatch(kernels.get("batch_norm2d_backward_parameters", constants), {x, w, m, s, dy, dw, db, y}, push,
                      groups);
}

}  // namespace tessera
