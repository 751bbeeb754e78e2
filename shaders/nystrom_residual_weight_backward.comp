#version 450
// nystrom_residual's weight gradient: dweight[h, t] += sum over the S rows i and head h's
// columns c of dout[i, h*d + c] v[i + t - kernel / 2, h*d + c] (dout's first dout_rows rows at
// most: the class token's alone where the attention gives only its row). A workgroup per (head,
// tap), its invocations sharing the (row, column) pairs.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x = 256) in;
#include "reduce.glsl"
layout(binding = 0) uniform samplerBuffer dout;
layout(binding = 1) uniform samplerBuffer qkv;
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer Dweight { float dweight[]; };
layout(push_constant) uniform Push {
  uint head_dim, width, kernel, dout_rows;
} p;

void main() {
  uint head = gl_WorkGroupID.x / p.kernel, t = gl_WorkGroupID.x % p.kernel;
  uint sequence = transmil_sequence_length(count), rows = min(sequence, p.dout_rows);
  int shift = int(t) - int(p.kernel / 2u);
  float partial = 0.0;
  for (uint pair = gl_LocalInvocationID.x; pair < rows * p.head_dim; pair += 256u) {
    uint i = pair / p.head_dim, column = head * p.head_dim + pair % p.head_dim;
    int j = int(i) + shift;
    if (j >= 0 && j < int(sequence))
      partial += texelFetch(dout, int(i * p.width + column)).x *
                 texelFetch(qkv, j * int(3u * p.width) + int(2u * p.width + column)).x;
  }
  float sum = workgroup_sum(vec2(partial, 0.0)).x;
  if (gl_LocalInvocationID.x == 0u) dweight[gl_WorkGroupID.x] += sum;
}
