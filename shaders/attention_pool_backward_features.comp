#version 450
// dh[n, d] (+)= a[n] dz[d] (a is 0 on padding rows)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer DZ { float dz[]; };
layout(std430, binding = 2) buffer DH { float dh[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.width) return;
  float grad = a[i / p.width] * dz[i % p.width];
  dh[i] = p.accumulate != 0u ? dh[i] + grad : grad;
}
