#version 450
// dh[n, d] (+)= sum_c a[c, n] dz[c*D + d] (a is 0 on padding rows)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer DZ { ACT dz[]; };
layout(std430, binding = 2) buffer DH { ACT dh[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.width) return;
  uint n = i / p.width, d = i % p.width;
  float grad = a[n] * float(dz[d]);  // column 0 first: one column is the sum ABMIL's pool takes
  for (uint c = 1; c < p.columns; ++c) grad += a[c * p.rows + n] * float(dz[c * p.width + d]);
  dh[i] = ACT(p.accumulate != 0u ? float(dh[i]) + grad : grad);
}
