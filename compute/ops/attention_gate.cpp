#include "compute/ops/attention_gate.h"

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct ForwardPush {
  uint32_t count;
};
struct BackwardPush {
  uint32_t count, accumulate_a, accumulate_b;
};
}  // namespace

std::unique_ptr<Op> make_attention_gate(const LayerConfig&) { return std::make_unique<AttentionGate>(); }

Shape AttentionGate::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 2 || inputs[0] != inputs[1])
    throw ShapeError("attention_gate takes two inputs of the same shape, got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])) +
                     (inputs.size() > 1 ? " and " + to_string(inputs[1]) : std::string()));
  count_ = element_count(inputs[0]);
  return inputs[0];
}

void AttentionGate::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto kernel = kernel_for<ForwardPush>(kernels, vk::kernel::attention_gate_forward, *t.output, {kElementwiseGroup});
  recorder.dispatch_elements(kernel,
                             {reads(*t.inputs[0]), reads(*t.inputs[1]),
                              writes(*t.output)},
                             ForwardPush{static_cast<uint32_t>(count_)}, count_, kElementwiseGroup);
}

// Both input gradients in one dispatch; the head always trains both branches.
void AttentionGate::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0] || !t.input_grads[1]) throw ShapeError("attention_gate needs the gradients of both inputs");
  auto kernel = kernel_for<BackwardPush>(kernels, vk::kernel::attention_gate_backward, *t.output_grad, {kElementwiseGroup});
  recorder.dispatch_elements(kernel,
                             {reads(*t.inputs[0]), reads(*t.inputs[1]),
                              reads(*t.output_grad), input_grad_arg(t, 0), input_grad_arg(t, 1)},
                             BackwardPush{static_cast<uint32_t>(count_), accumulates(t, 0), accumulates(t, 1)},
                             count_, kElementwiseGroup);
}

}  // namespace tessera
