#version 450
// z[d] = sum over n < count of a[n] h[n, d]
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer H { ACT h[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer Z { ACT z[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint d = global_index();
  if (d >= p.width) return;
  uint instances = min(count, p.rows);
  float sum = 0.0;
  for (uint n = 0; n < instances; ++n) sum += a[n] * float(h[n * p.width + d]);
  z[d] = ACT(sum);
}
