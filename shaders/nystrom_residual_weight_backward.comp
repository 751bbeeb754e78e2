#version 450
#extension GL_EXT_control_flow_attributes : require
// nystrom_residual's weight gradient: dweight[h, t] += sum over the S rows i and head h's
// columns c of dout[i, h*d + c] v[i + t - kernel / 2, h*d + c] (dout's first dout_rows rows at
// most: the class token's alone where the attention gives only its row). A workgroup per (head,
// tap), its invocations sharing the (row, column) pairs. 64 invocations: on lavapipe each level
// of the workgroup sum is a barrier over every lane, the cost of the kernel at small bags. Each
// takes 4 pairs an iteration, so that 100,000 rows of 64 columns stay within lavapipe's 65,535
// loop iterations.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x = 64) in;
#include "reduce.glsl"
layout(binding = 0) uniform samplerBuffer dout;
layout(binding = 1) uniform samplerBuffer values;
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
  uint pairs = rows * p.head_dim;
  for (uint first = 0u; first < pairs; first += 4u * 64u) {
    [[unroll]] for (uint step = 0u; step < 4u; ++step) {
      uint pair = first + step * 64u + gl_LocalInvocationID.x;
      uint i = pair / p.head_dim, column = head * p.head_dim + pair % p.head_dim;
      int j = int(i) + shift;
      if (pair < pairs && j >= 0 && j < int(sequence))
        partial += texelFetch(dout, int(i * p.width + column)).x *
                   texelFetch(values, j * int(p.width) + int(column)).x;
    }
  }
  float sum = workgroup_sum(vec2(partial, 0.0)).x;
  if (gl_LocalInvocationID.x == 0u) dweight[gl_WorkGroupID.x] += sum;
}
