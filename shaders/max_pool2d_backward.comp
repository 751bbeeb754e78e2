#version 450
// dx[plane, iy, ix] (+)= sum of dy[plane, oy, ox] over the windows that cover (iy, ix) and
// took their maximum from it.
#include "common.glsl"
#include "pool2d.glsl"
layout(std430, binding = 0) readonly buffer Argmax { uint argmax[]; };
layout(std430, binding = 1) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 2) buffer DX { ACT dx[]; };

void write_gradient(uint i, float g) {
  if (p.accumulate != 0u) g += float(dx[i]);
  dx[i] = ACT(g);
}

// Invocation o owns window o and every input in it.
void scatter_window(uint o) {
  uint ox = o % OUT_W, oy = (o / OUT_W) % OUT_H, plane = o / (OUT_W * OUT_H);
  uint best = argmax[o], plane_base = plane * IN_H * IN_W;
  float g = float(dy[o]);
  for (uint ky = 0; ky < KERNEL_SIZE; ++ky)
    for (uint kx = 0; kx < KERNEL_SIZE; ++kx) {
      uint at = (oy * KERNEL_SIZE + ky) * IN_W + ox * KERNEL_SIZE + kx;
      write_gradient(plane_base + at, at == best ? g : 0.0);
    }
}

// Invocation i owns input i and sums over the windows that cover it.
void gather_windows(uint i) {
  uint ix = i % IN_W, iy = (i / IN_W) % IN_H, plane = i / (IN_W * IN_H);
  uint at = iy * IN_W + ix, out_base = plane * OUT_H * OUT_W;
  ivec2 rows = covering_windows(int(iy), OUT_H), cols = covering_windows(int(ix), OUT_W);
  float g = 0.0;
  for (int oy = rows.x; oy <= rows.y; ++oy)
    for (int ox = cols.x; ox <= cols.y; ++ox) {
      uint o = out_base + uint(oy) * OUT_W + uint(ox);
      if (argmax[o] == at) g += float(dy[o]);
    }
  write_gradient(i, g);
}

void main() {
  uint i = global_index();
  if (i >= p.count) return;
  if (TILED)
    scatter_window(i);
  else
    gather_windows(i);
}
