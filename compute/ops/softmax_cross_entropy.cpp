#include "compute/ops/softmax_cross_entropy.h"

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct Push {
  uint32_t samples, classes, accumulate;
};
}  // namespace

std::unique_ptr<Op> make_softmax_cross_entropy(const LayerConfig&) {
  return std::make_unique<SoftmaxCrossEntropy>();
}

Shape SoftmaxCrossEntropy::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 2 || inputs[0].size() != 2 || inputs[1].size() != 1 || inputs[0][0] != inputs[1][0])
    throw ShapeError("softmax_cross_entropy takes logits [N,C] and labels [N], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])) +
                     (inputs.size() > 1 ? " and " + to_string(inputs[1]) : std::string()));
  samples_ = inputs[0][0];
  classes_ = inputs[0][1];
  return {samples_};
}

std::vector<TensorSpec> SoftmaxCrossEntropy::tensors() const {
  return {{"class_weight", {classes_}, TensorRole::state, DType::f32, {Init::ones}}};
}

// One invocation per sample: N is a batch and C a class count, both small, and each sample
// needs its whole row for the log-sum-exp.
void SoftmaxCrossEntropy::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto kernel = kernel_for<Push>(kernels, vk::kernel::softmax_cross_entropy_forward, *t.inputs[0], {kElementwiseGroup});
  recorder.dispatch_elements(kernel,
                             {reads(*t.inputs[0]), reads(*t.inputs[1]),
                              reads(*t.tensors[0]), writes(*t.output)},
                             Push{static_cast<uint32_t>(samples_), static_cast<uint32_t>(classes_), 0}, samples_,
                             kElementwiseGroup);
}

void SoftmaxCrossEntropy::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  auto kernel = kernel_for<Push>(kernels, vk::kernel::softmax_cross_entropy_backward, *t.inputs[0], {kElementwiseGroup});
  recorder.dispatch_elements(kernel,
                             {reads(*t.inputs[0]), reads(*t.inputs[1]),
                              reads(*t.tensors[0]), reads(*t.output_grad),
                              input_grad_arg(t, 0)},
                             Push{static_cast<uint32_t>(samples_), static_cast<uint32_t>(classes_),
                                  accumulates(t, 0)},
                             samples_, kElementwiseGroup);
}

}  // namespace tessera
