#include "compute/ops/flatten.h"

#include "compute/ops/add.h"

namespace tessera {

std::unique_ptr<Op> make_flatten(const LayerConfig&) { return std::make_unique<Flatten>(); }

Shape Flatten::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].empty())
    throw ShapeError("flatten takes one input with a batch dimension");
  count_ = element_count(inputs[0]);
  return {inputs[0][0], inputs[0][0] ? count_ / inputs[0][0] : 0};
}

void Flatten::forward(vk::Recorder& recorder, vk::Kernels&, const OpTensors& t) {
  recorder.copy(t.inputs[0]->buffer(), 0, t.output->buffer(), 0, t.output->bytes());
}

void Flatten::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  record_pass_through_grad(recorder, kernels, t, 0, count_);
}

}  // namespace tessera
