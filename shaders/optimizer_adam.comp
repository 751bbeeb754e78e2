#version 450
// Adam and AdamW, as PyTorch: g = grad * grad_scale (+ weight_decay * p for Adam; AdamW
// instead scales p by 1 - lr * weight_decay); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) with t = step[0] + 1; grad = 0.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool LOSS_SCALED = false;
layout(std430, binding = 0) buffer Parameter { float parameter[]; };
layout(std430, binding = 1) buffer Grad { float grad[]; };
layout(std430, binding = 2) buffer ExpAvg { float exp_avg[]; };
layout(std430, binding = 3) buffer ExpAvgSq { float exp_avg_sq[]; };
layout(std430, binding = 4) readonly buffer Step { uint step[]; };
// LOSS_SCALED (mixed precision): the loss scale's state (loss_scale_update.comp); unread otherwise.
layout(std430, binding = 5) readonly buffer LossScale { float loss_scale[]; };
layout(push_constant) uniform Push {
  uint count;
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  uint decoupled;
} p;

// base^t by squaring: exact for t = 1 and not at the mercy of a device's pow() precision.
float power(float base, uint t) {
  float result = 1.0;
  for (; t != 0u; t >>= 1) {
    if ((t & 1u) != 0u) result *= base;
    base *= base;
  }
  return result;
}

void main() {
  uint i = global_index();
  if (i >= p.count) return;
  // A step with a non-finite gradient anywhere is skipped (GradScaler); the gradient is still cleared.
  if (LOSS_SCALED && loss_scale[3] != 0.0) {
    grad[i] = 0.0;
    return;
  }
  float grad_scale = LOSS_SCALED ? p.grad_scale / loss_scale[0] : p.grad_scale;
  // Skipped steps advanced step[0] (dropout masks move on) but made no update (PyTorch's
  // step count stays), so they do not count in the bias correction.
  uint t = step[0] + 1u - (LOSS_SCALED ? uint(loss_scale[2]) : 0u);
  float w = parameter[i];
  float g = grad[i] * grad_scale;
  if (p.decoupled != 0u)
    w *= 1.0 - p.lr * p.weight_decay;
  else
    g += p.weight_decay * w;
  float m = p.beta1 * exp_avg[i] + (1.0 - p.beta1) * g;
  float v = p.beta2 * exp_avg_sq[i] + (1.0 - p.beta2) * g * g;
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  float bias_correction1 = 1.0 - power(p.beta1, t), bias_correction2 = 1.0 - power(p.beta2, t);
  float denominator = sqrt(v) / sqrt(bias_correction2) + p.eps;
  parameter[i] = w - p.lr / bias_correction1 * m / denominator;
  grad[i] = 0.0;
}
