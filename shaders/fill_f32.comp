#version 450
// y[i] = value
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint count; float value; } p;
void main() {
  uint i = global_index();
  if (i < p.count) y[i] = p.value;
}
