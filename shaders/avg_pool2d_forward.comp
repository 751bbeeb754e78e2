#version 450
// y[plane, oy, ox] = sum over the window of x[plane] (padding as zeros) / kernel_size^2
#include "common.glsl"
#include "pool2d.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
void main() {
  uint o = global_index();
  if (o >= p.count) return;
  uint ox = o % p.out_w, oy = (o / p.out_w) % p.out_h, plane = o / (p.out_w * p.out_h);
  uint plane_base = plane * p.in_h * p.in_w;
  int y0 = int(oy * p.stride) - p.padding, x0 = int(ox * p.stride) - p.padding;
  float sum = 0.0;
  for (int iy = max(y0, 0); iy < min(y0 + int(p.kernel_size), int(p.in_h)); ++iy)
    for (int ix = max(x0, 0); ix < min(x0 + int(p.kernel_size), int(p.in_w)); ++ix)
      sum += x[plane_base + uint(iy) * p.in_w + uint(ix)];
  y[o] = sum / float(p.kernel_size * p.kernel_size);
}
