#version 450
// dx[plane, i] (+)= dy[plane] / plane size
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push { uint count, plane, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float g = float(dy[i / p.plane]) / float(p.plane);
  dx[i] = ACT(p.accumulate != 0u ? float(dx[i]) + g : g);
}
