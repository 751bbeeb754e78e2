#version 450
// gathered[c, k] = sum over n < count of ds[n, c] Q[n, k] / sqrt(K): the gradient that reaches
// the critical instance's query through every instance's score
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DS { ACT ds[]; };
layout(std430, binding = 1) readonly buffer Q { ACT q[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer Gathered { float gathered[]; };
layout(push_constant) uniform Push { uint rows, width, classes, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.classes * p.width) return;
  uint c = i / p.width, k = i % p.width;
  uint instances = min(count, p.rows);
  float sum = 0.0;
  for (uint n = 0u; n < instances; ++n) sum += float(ds[n * p.classes + c]) * float(q[n * p.width + k]);
  gathered[i] = sum / sqrt(float(p.width));
}
