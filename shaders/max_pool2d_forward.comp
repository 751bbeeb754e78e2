#version 450
// y[plane, oy, ox] = max over the window of x[plane]; argmax = iy * in_w + ix of the first maximum.
#include "common.glsl"
#include "pool2d.glsl"
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) writeonly buffer Y { ACT y[]; };
layout(std430, binding = 2) writeonly buffer Argmax { uint argmax[]; };
void main() {
  uint o = global_index();
  if (o >= p.count) return;
  uint ox = o % OUT_W, oy = (o / OUT_W) % OUT_H, plane = o / (OUT_W * OUT_H);
  uint plane_base = plane * IN_H * IN_W;
  int y0 = int(oy * STRIDE) - PADDING, x0 = int(ox * STRIDE) - PADDING;
  float best = 0.0;
  uint best_at = 0xffffffffu;
  for (int iy = max(y0, 0); iy < min(y0 + int(KERNEL_SIZE), int(IN_H)); ++iy)
    for (int ix = max(x0, 0); ix < min(x0 + int(KERNEL_SIZE), int(IN_W)); ++ix) {
      uint at = uint(iy) * IN_W + uint(ix);
      float v = float(x[plane_base + at]);
      // NaN wins, as in PyTorch, so that divergence shows.
      if (best_at == 0xffffffffu || v > best || isnan(v)) {
        best = v;
        best_at = at;
      }
    }
  y[o] = ACT(best);
  argmax[o] = best_at;
}
