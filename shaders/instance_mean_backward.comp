#version 450
// dh[n, d] (+)= n < count ? dz[d] / count : 0 (padding rows get no gradient)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DZ { ACT dz[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) buffer DH { ACT dh[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.width) return;
  uint instances = min(count, p.rows);
  float g = i / p.width < instances ? float(dz[i % p.width]) / float(instances) : 0.0;
  dh[i] = ACT(p.accumulate != 0u ? float(dh[i]) + g : g);
}
