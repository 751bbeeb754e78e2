#include "compute/ops/ppeg.h"

#include "compute/ops/input_grad.h"
#include "compute/ops/transmil_sequence.h"

namespace tessera {

namespace {
constexpr int64_t kTaps = 50;  // a combined 7x7 kernel and the summed bias, per channel
constexpr int64_t kChannelsPerGroup = 16;  // ppeg_backward_weight_partial.comp's LANES
// tensors()'s order
enum Slot : size_t { weight7, bias7, weight5, bias5, weight3, bias3, combined, partial };
}  // namespace

std::unique_ptr<Op> make_ppeg(const LayerConfig&) { return std::make_unique<Ppeg>(); }

Shape Ppeg::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 2 || inputs[0].size() != 3 || inputs[0][0] != 1 || inputs[0][1] < 2 || inputs[1] != Shape{1})
    throw ShapeError("ppeg takes a TransMIL sequence [1, 1 + side*side, D] and a count [1], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])));
  const int64_t grid = inputs[0][1] - 1;
  side_ = transmil_grid_side(grid);
  if (side_ * side_ != grid)
    throw ShapeError("ppeg takes a TransMIL sequence [1, 1 + side*side, D]: " + to_string(inputs[0]) +
                     " holds no square grid after its class token");
  width_ = inputs[0][2];
  return inputs[0];
}

std::vector<TensorSpec> Ppeg::tensors() const {
  std::vector<TensorSpec> specs;
  for (auto [name, kernel] : {std::pair{"proj", 7}, std::pair{"proj1", 5}, std::pair{"proj2", 3}}) {
    // kaiming_uniform(a=sqrt(5)) over a fan-in of 1 * k * k: U(-1/k, 1/k), and the bias likewise.
    Init init{Init::uniform, 1.0f / static_cast<float>(kernel)};
    specs.push_back({std::string(name) + ".weight", {width_, 1, kernel, kernel}, TensorRole::parameter, DType::f32, init});
    specs.push_back({std::string(name) + ".bias", {width_}, TensorRole::parameter, DType::f32, init});
  }
  specs.push_back({"combined_kernel", {width_, kTaps}, TensorRole::prepared});
  TensorSpec scratch{"weight_grad_partial", {blocks(), width_, kTaps}, TensorRole::saved};
  scratch.training_only = scratch.pass_scratch = true;  // backward's alone
  specs.push_back(scratch);
  return specs;
}

Ppeg::Push Ppeg::push(uint32_t accumulate) const {
  return {static_cast<uint32_t>(width_), static_cast<uint32_t>(side_), accumulate, static_cast<uint32_t>(blocks())};
}

void Ppeg::prepare(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  recorder.dispatch_elements(kernels.get<Push>(vk::kernel::ppeg_combine, {kElementwiseGroup}),
                             {reads(*t.tensors[weight7]), reads(*t.tensors[bias7]), reads(*t.tensors[weight5]),
                              reads(*t.tensors[bias5]), reads(*t.tensors[weight3]), reads(*t.tensors[bias3]),
                              writes(*t.tensors[combined])},
                             push(0), static_cast<uint64_t>(width_ * kTaps), kElementwiseGroup);
}

void Ppeg::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  // Training combines the kernels every pass (D x 50 sums); inference did it once.
  if (!t.prepared) prepare(recorder, kernels, t);
  recorder.dispatch_elements(kernel_for<Push>(kernels, vk::kernel::ppeg_forward, *t.output, {kElementwiseGroup}),
                             {reads(*t.inputs[0]), reads(*t.inputs[1]), reads(*t.tensors[combined]), writes(*t.output)},
                             push(0), static_cast<uint64_t>(t.output->count()), kElementwiseGroup);
}

void Ppeg::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Tensor& dy = *t.output_grad;
  if (t.input_grads[0])
    recorder.dispatch_elements(
        kernel_for<Push>(kernels, vk::kernel::ppeg_backward_input, dy, {kElementwiseGroup}),
        {reads(dy), reads(*t.inputs[1]), reads(*t.tensors[combined]), input_grad_arg(t, 0)}, push(accumulates(t, 0)),
        static_cast<uint64_t>(dy.count()), kElementwiseGroup);
  // A workgroup for every 16 channels and block of pixels (ppeg_backward_weight_partial.comp).
  recorder.dispatch(kernels.get<Push>(vk::kernel::ppeg_backward_weight_partial),
                    {reads(dy), reads(*t.inputs[0]), reads(*t.inputs[1]), writes(*t.tensors[partial])}, push(0),
                    static_cast<uint32_t>((width_ + kChannelsPerGroup - 1) / kChannelsPerGroup),
                    static_cast<uint32_t>(blocks()));
  recorder.dispatch_elements(kernels.get<Push>(vk::kernel::ppeg_backward_weight, {kElementwiseGroup}),
                             {reads(*t.tensors[partial]), updates(*t.grads[weight7]), updates(*t.grads[bias7]),
                              updates(*t.grads[weight5]), updates(*t.grads[bias5]), updates(*t.grads[weight3]),
                              updates(*t.grads[bias3])},
                             push(1), static_cast<uint64_t>(width_ * kTaps), kElementwiseGroup);
}

}  // namespace tessera
