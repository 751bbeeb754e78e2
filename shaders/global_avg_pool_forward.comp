#version 450
// y[plane] = mean of x[plane, :]
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push { uint count, plane, accumulate; } p;
void main() {
  uint o = global_index();
  if (o >= p.count) return;
  float sum = 0.0;
  for (uint i = o * p.plane; i < (o + 1u) * p.plane; ++i) sum += float(x[i]);
  y[o] = ACT(sum / float(p.plane));
}
