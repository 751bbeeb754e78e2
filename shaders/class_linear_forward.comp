#version 450
// y[n, c] = sum_d x[n, c*D + d] weight[c, d] + bias[c]
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) readonly buffer W { float weight[]; };
layout(std430, binding = 2) readonly buffer B { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push { uint batch, classes, width, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.batch * p.classes) return;
  uint n = i / p.classes, c = i % p.classes;
  uint row = n * p.classes * p.width + c * p.width;
  float sum = bias[c];
  for (uint d = 0u; d < p.width; ++d) sum += float(x[row + d]) * weight[c * p.width + d];
  y[i] = ACT(sum);
}
