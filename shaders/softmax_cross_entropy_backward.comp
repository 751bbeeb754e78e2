#version 450
// dlogits[n, c] (+)= dloss[n] * w[y[n]] / sum_m w[y[m]] * (softmax(logits[n])[c] - (c == y[n]))
#include "common.glsl"
layout(local_size_x_id = 0) in;
#include "softmax_cross_entropy.glsl"
layout(std430, binding = 3) readonly buffer DLoss { float dloss[]; };
layout(std430, binding = 4) buffer DLogits { ACT dlogits[]; };
void main() {
  uint n = global_index();
  if (n >= p.samples) return;
  float scale = dloss[n] * sample_weight(n) / weight_total();
  float lse = log_sum_exp(n);
  uint row = n * p.classes;
  for (uint c = 0; c < p.classes; ++c) {
    float g = scale * (exp(float(logits[row + c]) - lse) - (c == labels[n] ? 1.0 : 0.0));
    dlogits[row + c] = ACT(p.accumulate != 0u ? float(dlogits[row + c]) + g : g);
  }
}
