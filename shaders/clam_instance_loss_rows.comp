#version 450
// For each used slot s of class c over row n: logits z = weight[c] h[n] + bias[c] (2 of them),
// row_losses[s] = w_s (log_sum_exp(z) - z[target]), row_grads[s] = w_s (softmax(z) - onehot(target));
// zeros for unused slots
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer H { ACT h[]; };
layout(std430, binding = 1) readonly buffer W { float weight[]; };
layout(std430, binding = 2) readonly buffer B { float bias[]; };
layout(std430, binding = 3) readonly buffer Selected { uint selected[]; };
layout(std430, binding = 4) readonly buffer Count { uint count; };
layout(std430, binding = 5) readonly buffer Labels { uint label; };
layout(std430, binding = 6) writeonly buffer RowGrads { float row_grads[]; };
layout(std430, binding = 7) writeonly buffer RowLosses { float row_losses[]; };
#include "clam_instance_loss.glsl"
void main() {
  uint s = global_index();
  if (s >= p.classes * 2u * p.k_sample) return;
  if (selected[s] == kUnused) {
    row_grads[2u * s] = 0.0;
    row_grads[2u * s + 1u] = 0.0;
    row_losses[s] = 0.0;
    return;
  }
  uint c = s / (2u * p.k_sample), n = selected[s], row = n * p.width;
  uint w0 = c * 2u * p.width, w1 = w0 + p.width;
  float z0 = bias[2u * c], z1 = bias[2u * c + 1u];
  for (uint d = 0u; d < p.width; ++d) {
    float x = float(h[row + d]);
    z0 += weight[w0 + d] * x;
    z1 += weight[w1 + d] * x;
  }
  float largest = max(z0, z1);
  float e0 = exp(z0 - largest), e1 = exp(z1 - largest);
  float log_sum = largest + log(e0 + e1);
  uint target = slot_target(s, label);
  float w = slot_weight(s, label, count);
  row_losses[s] = w * (log_sum - (target == 1u ? z1 : z0));
  row_grads[2u * s] = w * (e0 / (e0 + e1) - (target == 0u ? 1.0 : 0.0));
  row_grads[2u * s + 1u] = w * (e1 / (e0 + e1) - (target == 1u ? 1.0 : 0.0));
}
