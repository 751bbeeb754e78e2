#version 450
// dh [M, D] from dy [S_max, D] of TransMIL's sequence: an instance's row and, where the padding
// repeated it (r < side^2 - n), its copy's; rows past the count get none.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) buffer DH { ACT dh[]; };
layout(push_constant) uniform Push { uint rows, width, sequence_rows, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.width) return;
  uint r = i / p.width, d = i % p.width;
  uint instances = min(count, p.rows);
  uint side = transmil_grid_side(instances);
  float g = 0.0;
  if (r < instances) {
    g = float(dy[(1u + r) * p.width + d]);
    if (r < side * side - instances) g += float(dy[(1u + instances + r) * p.width + d]);
  }
  dh[i] = ACT(p.accumulate != 0u ? float(dh[i]) + g : g);
}
