#version 450
// i < C*D: dweight[c, d] += sum_n dy[n, c] x[n, c*D + d]; then dbias[c] += sum_n dy[n, c]
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) readonly buffer X { ACT x[]; };
layout(std430, binding = 2) buffer DW { float dweight[]; };
layout(std430, binding = 3) buffer DB { float dbias[]; };
layout(push_constant) uniform Push { uint batch, classes, width, accumulate; } p;
void main() {
  uint i = global_index();
  uint weights = p.classes * p.width;
  if (i >= weights + p.classes) return;
  float sum = 0.0;
  if (i < weights) {
    uint c = i / p.width, d = i % p.width;
    for (uint n = 0u; n < p.batch; ++n)
      sum += float(dy[n * p.classes + c]) * float(x[n * weights + c * p.width + d]);
    dweight[i] += sum;
  } else {
    uint c = i - weights;
    for (uint n = 0u; n < p.batch; ++n) sum += float(dy[n * p.classes + c]);
    dbias[c] += sum;
  }
}
