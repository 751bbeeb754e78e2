#version 450
// dx[plane, iy, ix] (+)= sum of dy[plane, oy, ox] over the windows that cover (iy, ix) / kernel_size^2
#include "common.glsl"
#include "pool2d.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { float dy[]; };
layout(std430, binding = 1) buffer DX { float dx[]; };
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint ix = i % p.in_w, iy = (i / p.in_w) % p.in_h, plane = i / (p.in_w * p.in_h);
  uint out_base = plane * p.out_h * p.out_w;
  ivec2 rows = covering_windows(int(iy), p.out_h), cols = covering_windows(int(ix), p.out_w);
  float sum = 0.0;
  for (int oy = rows.x; oy <= rows.y; ++oy)
    for (int ox = cols.x; ox <= cols.y; ++ox) sum += dy[out_base + uint(oy) * p.out_w + uint(ox)];
  float g = sum / float(p.kernel_size * p.kernel_size);
  dx[i] = p.accumulate != 0u ? dx[i] + g : g;
}
