#version 450
// dh[n, d] += dl sum over slots s with selected[s] = n of sum_t row_grads[s, t] weight[c(s), t, d],
// written by the invocation of the first slot that chose n (the others return): every chosen row
// once, in slot order. The rows no slot chose are left as they are (zeroed before, or another
// consumer's share).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer W { float weight[]; };
layout(std430, binding = 1) readonly buffer Selected { uint selected[]; };
layout(std430, binding = 2) readonly buffer RowGrads { float row_grads[]; };
layout(std430, binding = 3) readonly buffer DL { float dl; };
layout(std430, binding = 4) buffer DH { ACT dh[]; };
#include "clam_instance_loss.glsl"
void main() {
  uint i = global_index();
  uint slots = p.classes * 2u * p.k_sample;
  if (i >= slots * p.width) return;
  uint s = i / p.width, d = i % p.width, n = selected[s];
  if (n == kUnused) return;
  for (uint earlier = 0u; earlier < s; ++earlier)
    if (selected[earlier] == n) return;
  float sum = 0.0;
  for (uint other = s; other < slots; ++other) {
    if (selected[other] != n) continue;
    uint w = (other / (2u * p.k_sample)) * 2u * p.width + d;
    sum += row_grads[2u * other] * weight[w] + row_grads[2u * other + 1u] * weight[w + p.width];
  }
  dh[n * p.width + d] = ACT(float(dh[n * p.width + d]) + dl * sum);
}
