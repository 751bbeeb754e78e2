#version 450
// y[plane, oy, ox] = max over the window of x[plane]; argmax = iy * in_w + ix of the first maximum.
#include "common.glsl"
#include "pool2d.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(std430, binding = 2) writeonly buffer Argmax { uint argmax[]; };
void main() {
  uint o = global_index();
  if (o >= p.count) return;
  uint ox = o % p.out_w, oy = (o / p.out_w) % p.out_h, plane = o / (p.out_w * p.out_h);
  uint plane_base = plane * p.in_h * p.in_w;
  int y0 = int(oy * p.stride) - p.padding, x0 = int(ox * p.stride) - p.padding;
  float best = 0.0;
  uint best_at = 0xffffffffu;
  for (int iy = max(y0, 0); iy < min(y0 + int(p.kernel_size), int(p.in_h)); ++iy)
    for (int ix = max(x0, 0); ix < min(x0 + int(p.kernel_size), int(p.in_w)); ++ix) {
      uint at = uint(iy) * p.in_w + uint(ix);
      float v = x[plane_base + at];
      // NaN wins, as in PyTorch, so that divergence shows.
      if (best_at == 0xffffffffu || v > best || isnan(v)) {
        best = v;
        best_at = at;
      }
    }
  y[o] = best;
  argmax[o] = best_at;
}
