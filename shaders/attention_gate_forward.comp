#version 450
// y = tanh(a) * sigmoid(b)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { ACT a[]; };
layout(std430, binding = 1) readonly buffer B { ACT b[]; };
layout(std430, binding = 2) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push { uint count; } p;
void main() {
  uint i = global_index();
  if (i < p.count) y[i] = ACT(tanh(float(a[i])) / (1.0 + exp(-float(b[i]))));
}
