#version 450
// dh[n, d] (+)= a[n] dz[d] (a is 0 on padding rows)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer DZ { ACT dz[]; };
layout(std430, binding = 2) buffer DH { ACT dh[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.width) return;
  float grad = a[i / p.width] * float(dz[i % p.width]);
  dh[i] = ACT(p.accumulate != 0u ? float(dh[i]) + grad : grad);
}
