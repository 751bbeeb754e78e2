#version 450
// dx (+)= dy: the gradient of an input that reaches the output unchanged (add, flatten).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { float dy[]; };
layout(std430, binding = 1) buffer DX { float dx[]; };
layout(push_constant) uniform Push { uint count; uint accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  dx[i] = p.accumulate != 0u ? dx[i] + dy[i] : dy[i];
}
