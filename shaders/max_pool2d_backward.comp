#version 450
// dx[plane, iy, ix] (+)= sum of dy[plane, oy, ox] over the windows that cover (iy, ix) and
// took their maximum from it.
#include "common.glsl"
#include "pool2d.glsl"
layout(std430, binding = 0) readonly buffer Argmax { uint argmax[]; };
layout(binding = 1) uniform samplerBuffer dy;
layout(std430, binding = 2) buffer DX { float dx[]; };
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint ix = i % IN_W, iy = (i / IN_W) % IN_H, plane = i / (IN_W * IN_H);
  uint at = iy * IN_W + ix, out_base = plane * OUT_H * OUT_W;
  ivec2 rows = covering_windows(int(iy), OUT_H), cols = covering_windows(int(ix), OUT_W);
  float g = 0.0;
  for (int oy = rows.x; oy <= rows.y; ++oy)
    for (int ox = cols.x; ox <= cols.y; ++ox) {
      uint o = out_base + uint(oy) * OUT_W + uint(ox);
      if (argmax[o] == at) g += texelFetch(dy, int(o)).x;
    }
  if (p.accumulate != 0u) g += dx[i];
  dx[i] = g;
}
