#version 450
// dx (+)= dy: the gradient of an input that reaches the output unchanged (add, flatten).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push { uint count; uint accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float g = float(dy[i]);
  dx[i] = ACT(p.accumulate != 0u ? float(dx[i]) + g : g);
}
