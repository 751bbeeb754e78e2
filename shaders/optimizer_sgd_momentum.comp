#version 450
// SGD with momentum, as PyTorch (dampening 0): g = grad * grad_scale + weight_decay * p;
// buf = momentum * buf + g; p -= lr * (nesterov ? g + momentum * buf : buf); grad = 0.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) buffer Parameter { float parameter[]; };
layout(std430, binding = 1) buffer Grad { float grad[]; };
layout(std430, binding = 2) buffer MomentumBuffer { float momentum_buffer[]; };
layout(push_constant) uniform Push {
  uint count;
  float lr, momentum, weight_decay, grad_scale;
  uint nesterov;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float w = parameter[i];
  float g = grad[i] * p.grad_scale + p.weight_decay * w;
  float buf = p.momentum * momentum_buffer[i] + g;
  momentum_buffer[i] = buf;
  parameter[i] = w - p.lr * (p.nesterov != 0u ? g + p.momentum * buf : buf);
  grad[i] = 0.0;
}
