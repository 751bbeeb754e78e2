#version 450
// y = a + b; RELU (fused in): y = relu(a + b), NaN kept
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool RELU = false;
layout(std430, binding = 0) readonly buffer A { ACT a[]; };
layout(std430, binding = 1) readonly buffer B { ACT b[]; };
layout(std430, binding = 2) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push { uint count; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float sum = float(a[i]) + float(b[i]);
  y[i] = ACT(RELU ? relu(sum) : sum);
}
