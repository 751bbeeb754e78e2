#version 450
// y = tanh(x)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push { uint count, accumulate; } p;
void main() {
  uint i = global_index();
  if (i < p.count) y[i] = ACT(tanh(float(x[i])));
}
