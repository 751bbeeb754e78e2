#version 450
// dQ[n, k] (+)= sum_c ds[n, c] Q[critical[c], k] / sqrt(K) + sum over c with critical[c] = n of
// gathered[c, k]; 0 for padding rows
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DS { ACT ds[]; };
layout(std430, binding = 1) readonly buffer Q { ACT q[]; };
layout(std430, binding = 2) readonly buffer Critical { uint critical[]; };
layout(std430, binding = 3) readonly buffer Gathered { float gathered[]; };
layout(std430, binding = 4) readonly buffer Count { uint count; };
layout(std430, binding = 5) buffer DQ { ACT dq[]; };
layout(push_constant) uniform Push { uint rows, width, classes, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.width) return;
  uint n = i / p.width, k = i % p.width;
  float grad = 0.0;
  if (n < min(count, p.rows)) {
    for (uint c = 0u; c < p.classes; ++c) grad += float(ds[n * p.classes + c]) * float(q[critical[c] * p.width + k]);
    grad /= sqrt(float(p.width));
    for (uint c = 0u; c < p.classes; ++c)
      if (critical[c] == n) grad += gathered[c * p.width + k];
  }
  dq[i] = ACT(p.accumulate != 0u ? float(dq[i]) + grad : grad);
}
