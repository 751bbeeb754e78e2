#version 450
// dx (+)= y > 0 ? dy : 0. Reads the output, not the input: forward may run in place.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer DY { float dy[]; };
layout(std430, binding = 2) buffer DX { float dx[]; };
layout(push_constant) uniform Push { uint count; uint accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float g = y[i] > 0.0 ? dy[i] : 0.0;
  dx[i] = p.accumulate != 0u ? dx[i] + g : g;
}
