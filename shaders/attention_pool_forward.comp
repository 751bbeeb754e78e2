#version 450
// z[c*D + d] = sum over n < count of a[c, n] h[n, d]
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer H { ACT h[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer Z { ACT z[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns; } p;
void main() {
  uint i = global_index();
  if (i >= p.columns * p.width) return;
  uint c = i / p.width, d = i % p.width;
  uint instances = min(count, p.rows);
  float sum = 0.0;
  for (uint n = 0; n < instances; ++n) sum += a[c * p.rows + n] * float(h[n * p.width + d]);
  z[i] = ACT(sum);
}
