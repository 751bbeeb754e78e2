#version 450
// Nystrom attention's residual of the values (nystrom_attention.py's res_conv: a depthwise
// Conv2d(heads, heads, (kernel, 1), padding (kernel / 2, 0)) over the sequence): out[i, h*d + c]
// += sum_t weight[h, t] v[i + t - kernel / 2, h*d + c], v zero outside the S rows (the front
// padding's rows are zero, as is the convolution's). One invocation per output.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer values;
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer Out { ACT out_values[]; };
layout(push_constant) uniform Push {
  uint rows, head_dim, width, kernel;
} p;

void main() {
  uint index = global_index();
  if (index >= p.rows * p.width) return;
  uint i = index / p.width, column = index % p.width, head = column / p.head_dim;
  uint sequence = transmil_sequence_length(count);
  if (i >= sequence) return;
  int reach = int(p.kernel / 2u);
  float sum = 0.0;
  for (int t = 0; t < int(p.kernel); ++t) {
    int j = int(i) + t - reach;
    if (j >= 0 && j < int(sequence))
      sum += weight[head * p.kernel + uint(t)] * texelFetch(values, j * int(p.width) + int(column)).x;
  }
  out_values[index] = ACT(float(out_values[index]) + sum);
}
