// How a backward pass binds the gradient of an input: overwritten, or added to where another
// consumer of the same tensor has already written its share (OpTensors::accumulate_input_grads).
#pragma once
#include "compute/op.h"

namespace tessera {

inline vk::BufferArg input_grad_arg(const OpTensors& t, size_t input) {
  const Tensor& grad = *t.input_grads[input];
  return t.accumulate_input_grads[input] ? updates(grad) : writes(grad);
}

inline uint32_t accumulates(const OpTensors& t, size_t input) { return t.accumulate_input_grads[input] ? 1u : 0u; }

}  // namespace tessera
