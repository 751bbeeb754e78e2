#version 450
// SGD without momentum: p -= lr * (grad * grad_scale + weight_decay * p); grad = 0.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) buffer Parameter { float parameter[]; };
layout(std430, binding = 1) buffer Grad { float grad[]; };
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
  parameter[i] = w - p.lr * g;
  grad[i] = 0.0;
}
