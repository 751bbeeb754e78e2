#version 450
// dx[plane, iy, ix] (+)= sum of dy[plane, oy, ox] over the windows that cover (iy, ix) / kernel_size^2
#include "common.glsl"
#include "pool2d.glsl"
layout(std430, binding = 0) readonly buffer DY { float dy[]; };
layout(std430, binding = 1) buffer DX { float dx[]; };
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint ix = i % IN_W, iy = (i / IN_W) % IN_H, plane = i / (IN_W * IN_H);
  uint out_base = plane * OUT_H * OUT_W;
  ivec2 rows = covering_windows(int(iy), OUT_H), cols = covering_windows(int(ix), OUT_W);
  float sum = 0.0;
  for (int oy = rows.x; oy <= rows.y; ++oy)
    for (int ox = cols.x; ox <= cols.y; ++ox) sum += dy[out_base + uint(oy) * OUT_W + uint(ox)];
  float g = sum / float(KERNEL_SIZE * KERNEL_SIZE);
  dx[i] = p.accumulate != 0u ? dx[i] + g : g;
}
