#version 450
// y = a + b; RELU (fused in): y = relu(a + b), NaN kept
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool RELU = false;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint count; } p;
void main() {
  uint i = global_index();
  if (i < p.count) y[i] = RELU ? relu(a[i] + b[i]) : a[i] + b[i];
}
