#version 450
// The values' share of nystrom_residual's gradient: dv[j, h*d + c] += sum_t weight[h, t]
// dout[j - t + kernel / 2, h*d + c] over the S rows, or over dout's first dout_rows (the class
// token's alone where the attention gives only its row). One invocation per value.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer dout;
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer Dv { ACT dv[]; };
layout(push_constant) uniform Push {
  uint rows, head_dim, width, kernel, dout_rows;
} p;

void main() {
  uint index = global_index();
  if (index >= p.rows * p.width) return;
  uint j = index / p.width, column = index % p.width, head = column / p.head_dim;
  uint sequence = transmil_sequence_length(count);
  if (j >= sequence) return;
  int reach = int(p.kernel / 2u);
  uint dout_rows = min(sequence, p.dout_rows);
  float sum = 0.0;
  for (int t = 0; t < int(p.kernel); ++t) {
    int i = int(j) - t + reach;
    if (i >= 0 && i < int(dout_rows)) sum += weight[head * p.kernel + uint(t)] * texelFetch(dout, i * int(p.width) + int(column)).x;
  }
  dv[index] = ACT(float(dv[index]) + sum);
}
