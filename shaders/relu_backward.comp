#version 450
// dx (+)= y > 0 ? dy : 0. Reads the output, not the input: forward may run in place.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer y;
layout(binding = 1) uniform samplerBuffer dy;
layout(std430, binding = 2) buffer DX { float dx[]; };
layout(push_constant) uniform Push { uint count; uint accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float g = texelFetch(y, int(i)).x > 0.0 ? texelFetch(dy, int(i)).x : 0.0;
  if (p.accumulate != 0u) g += dx[i];
  dx[i] = g;
}
