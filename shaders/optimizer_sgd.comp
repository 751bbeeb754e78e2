#version 450
// SGD without momentum: p -= lr * (grad * grad_scale + weight_decay * p); grad = 0.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool LOSS_SCALED = false;
layout(std430, binding = 0) buffer Parameter { float parameter[]; };
layout(std430, binding = 1) buffer Grad { float grad[]; };
// LOSS_SCALED (mixed precision): the loss scale's state (loss_scale_update.comp); unread otherwise.
layout(std430, binding = 2) readonly buffer LossScale { float loss_scale[]; };
layout(push_constant) uniform Push {
  uint count;
  float lr, momentum, weight_decay, grad_scale;
  uint nesterov;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  // A step with a non-finite gradient anywhere is skipped (GradScaler); the gradient is still cleared.
  if (LOSS_SCALED && loss_scale[3] != 0.0) {
    grad[i] = 0.0;
    return;
  }
  float grad_scale = LOSS_SCALED ? p.grad_scale / loss_scale[0] : p.grad_scale;
  float w = parameter[i];
  float g = grad[i] * grad_scale + p.weight_decay * w;
  parameter[i] = w - p.lr * g;
  grad[i] = 0.0;
}
