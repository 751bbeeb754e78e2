#version 450
// g[c, n] = sum_d dz[c*D + d] h[n, d] for the window's rows n: how pool c's output moves with
// instance n's weight. h is bound from the window's first row on.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DZ { ACT dz[]; };
layout(std430, binding = 1) readonly buffer H { ACT h[]; };
layout(std430, binding = 2) writeonly buffer G { float g[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns, first, window; } p;
void main() {
  uint i = global_index();
  if (i >= p.columns * p.window) return;
  uint c = i / p.window, row = i % p.window;
  float sum = 0.0;
  for (uint d = 0; d < p.width; ++d) sum += float(dz[c * p.width + d]) * float(h[row * p.width + d]);
  g[c * p.rows + p.first + row] = sum;
}
