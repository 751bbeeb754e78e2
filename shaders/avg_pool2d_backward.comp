#version 450
// dx[plane, iy, ix] (+)= sum of dy[plane, oy, ox] over the windows that cover (iy, ix) / kernel_size^2
#include "common.glsl"
#include "pool2d.glsl"
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) buffer DX { ACT dx[]; };

float window_share() { return 1.0 / float(KERNEL_SIZE * KERNEL_SIZE); }

void write_gradient(uint i, float g) {
  if (p.accumulate != 0u) g += float(dx[i]);
  dx[i] = ACT(g);
}

// Invocation o owns window o and every input in it.
void scatter_window(uint o) {
  uint ox = o % OUT_W, oy = (o / OUT_W) % OUT_H, plane = o / (OUT_W * OUT_H);
  uint plane_base = plane * IN_H * IN_W;
  float g = float(dy[o]) * window_share();
  for (uint ky = 0; ky < KERNEL_SIZE; ++ky)
    for (uint kx = 0; kx < KERNEL_SIZE; ++kx)
      write_gradient(plane_base + (oy * KERNEL_SIZE + ky) * IN_W + ox * KERNEL_SIZE + kx, g);
}

// Invocation i owns input i and sums over the windows that cover it.
void gather_windows(uint i) {
  uint ix = i % IN_W, iy = (i / IN_W) % IN_H, plane = i / (IN_W * IN_H);
  uint out_base = plane * OUT_H * OUT_W;
  ivec2 rows = covering_windows(int(iy), OUT_H), cols = covering_windows(int(ix), OUT_W);
  float sum = 0.0;
  for (int oy = rows.x; oy <= rows.y; ++oy)
    for (int ox = cols.x; ox <= cols.y; ++ox) sum += float(dy[out_base + uint(oy) * OUT_W + uint(ox)]);
  write_gradient(i, sum * window_share());
}

void main() {
  uint i = global_index();
  if (i >= p.count) return;
  if (TILED)
    scatter_window(i);
  else
    gather_windows(i);
}
