#version 450
// loss[n] = w[y[n]] * (log_sum_exp(logits[n]) - logits[n, y[n]]) / sum_m w[y[m]]
#include "common.glsl"
layout(local_size_x_id = 0) in;
#include "softmax_cross_entropy.glsl"
layout(std430, binding = 3) writeonly buffer Loss { float loss[]; };
void main() {
  uint n = global_index();
  if (n >= p.samples) return;
  float w = sample_weight(n);
  float target = labels[n] < p.classes ? float(logits[n * p.classes + labels[n]]) : not_a_number();
  loss[n] = w * (log_sum_exp(n) - target) / weight_total();
}
