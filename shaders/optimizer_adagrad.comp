#version 450
// Adagrad, as PyTorch (lr_decay 0, initial accumulator 0): g = grad * grad_scale +
// weight_decay * p; sum += g^2; p -= lr * g / (sqrt(sum) + eps); grad = 0.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) buffer Parameter { float parameter[]; };
layout(std430, binding = 1) buffer Grad { float grad[]; };
layout(std430, binding = 2) buffer Sum { float sum[]; };
layout(push_constant) uniform Push {
  uint count;
  float lr, eps, weight_decay, grad_scale;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float w = parameter[i];
  float g = grad[i] * p.grad_scale + p.weight_decay * w;
  float s = sum[i] + g * g;
  sum[i] = s;
  parameter[i] = w - p.lr * g / (sqrt(s) + p.eps);
  grad[i] = 0.0;
}
