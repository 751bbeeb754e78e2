#version 450
// dx[plane, iy, ix] (+)= sum of dy[plane, oy, ox] over the windows that cover (iy, ix) and
// took their maximum from it.
#include "common.glsl"
#include "pool2d.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Argmax { uint argmax[]; };
layout(std430, binding = 1) readonly buffer DY { float dy[]; };
layout(std430, binding = 2) buffer DX { float dx[]; };
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint ix = i % p.in_w, iy = (i / p.in_w) % p.in_h, plane = i / (p.in_w * p.in_h);
  uint at = iy * p.in_w + ix, out_base = plane * p.out_h * p.out_w;
  ivec2 rows = covering_windows(int(iy), p.out_h), cols = covering_windows(int(ix), p.out_w);
  float g = 0.0;
  for (int oy = rows.x; oy <= rows.y; ++oy)
    for (int ox = cols.x; ox <= cols.y; ++ox) {
      uint o = out_base + uint(oy) * p.out_w + uint(ox);
      if (argmax[o] == at) g += dy[o];
    }
  dx[i] = p.accumulate != 0u ? dx[i] + g : g;
}
