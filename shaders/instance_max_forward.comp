#version 450
// argmax[d] = the first n < count with the largest h[n, d]; z[d] = h[argmax[d], d]. A strict
// comparison keeps the first of equal values, so ties resolve the same way on every run.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer H { ACT h[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) writeonly buffer Argmax { uint argmax[]; };
layout(std430, binding = 3) writeonly buffer Z { ACT z[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint d = global_index();
  if (d >= p.width) return;
  uint instances = max(min(count, p.rows), 1u);
  uint best = 0u;
  float largest = float(h[d]);
  for (uint n = 1u; n < instances; ++n) {
    float value = float(h[n * p.width + d]);
    if (value > largest) {
      largest = value;
      best = n;
    }
  }
  argmax[d] = best;
  z[d] = h[best * p.width + d];
}
