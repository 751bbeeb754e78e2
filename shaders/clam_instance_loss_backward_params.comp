#version 450
// i < C*2*D: dweight[c, t, d] += dl sum over c's slots s of row_grads[s, t] h[selected[s], d];
// then dbias[c, t] += dl sum over c's slots of row_grads[s, t] (unused slots hold zeros)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer H { ACT h[]; };
layout(std430, binding = 1) readonly buffer Selected { uint selected[]; };
layout(std430, binding = 2) readonly buffer RowGrads { float row_grads[]; };
layout(std430, binding = 3) readonly buffer DL { float dl; };
layout(std430, binding = 4) buffer DW { float dweight[]; };
layout(std430, binding = 5) buffer DB { float dbias[]; };
#include "clam_instance_loss.glsl"
void main() {
  uint i = global_index();
  uint weights = p.classes * 2u * p.width;
  if (i >= weights + 2u * p.classes) return;
  bool is_weight = i < weights;
  uint ct = is_weight ? i / p.width : i - weights, d = i % p.width;
  uint c = ct / 2u, t = ct % 2u, first = c * 2u * p.k_sample;
  float sum = 0.0;
  for (uint s = first; s < first + 2u * p.k_sample; ++s) {
    if (selected[s] == kUnused) continue;
    sum += row_grads[2u * s + t] * (is_weight ? float(h[selected[s] * p.width + d]) : 1.0);
  }
  if (is_weight)
    dweight[i] += dl * sum;
  else
    dbias[ct] += dl * sum;
}
