#version 450
// dh[n, d] (+)= n == argmax[d] ? dz[d] : 0 (every other row, padding included, gets none)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DZ { ACT dz[]; };
layout(std430, binding = 1) readonly buffer Argmax { uint argmax[]; };
layout(std430, binding = 2) buffer DH { ACT dh[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.width) return;
  uint d = i % p.width;
  float g = i / p.width == argmax[d] ? float(dz[d]) : 0.0;
  dh[i] = ACT(p.accumulate != 0u ? float(dh[i]) + g : g);
}
