#version 450
// y[plane, oy, ox] = sum over the window of x[plane] (padding as zeros) / kernel_size^2
#include "common.glsl"
#include "pool2d.glsl"
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) writeonly buffer Y { ACT y[]; };
void main() {
  uint o = global_index();
  if (o >= p.count) return;
  uint ox = o % OUT_W, oy = (o / OUT_W) % OUT_H, plane = o / (OUT_W * OUT_H);
  uint plane_base = plane * IN_H * IN_W;
  int y0 = int(oy * STRIDE) - PADDING, x0 = int(ox * STRIDE) - PADDING;
  float sum = 0.0;
  for (int iy = max(y0, 0); iy < min(y0 + int(KERNEL_SIZE), int(IN_H)); ++iy)
    for (int ix = max(x0, 0); ix < min(x0 + int(KERNEL_SIZE), int(IN_W)); ++ix)
      sum += float(x[plane_base + uint(iy) * IN_W + uint(ix)]);
  y[o] = ACT(sum / float(KERNEL_SIZE * KERNEL_SIZE));
}
