#version 450
// g[n] = sum_d dz[d] h[n, d]: how the pooled output moves with instance n's weight
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DZ { ACT dz[]; };
layout(std430, binding = 1) readonly buffer H { ACT h[]; };
layout(std430, binding = 2) writeonly buffer G { float g[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint n = global_index();
  if (n >= p.rows) return;
  float sum = 0.0;
  for (uint d = 0; d < p.width; ++d) sum += float(dz[d]) * float(h[n * p.width + d]);
  g[n] = sum;
}
