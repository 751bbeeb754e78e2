#version 450
// y = max(x, 0)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint count; } p;
void main() {
  uint i = global_index();
  if (i < p.count) y[i] = max(x[i], 0.0);
}
