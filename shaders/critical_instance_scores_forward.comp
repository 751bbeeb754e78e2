#version 450
// s[n, c] = <Q[n], Q[critical[c]]> / sqrt(K) for n < count; 0 for padding rows
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Q { ACT q[]; };
layout(std430, binding = 1) readonly buffer Critical { uint critical[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer S { ACT s[]; };
layout(push_constant) uniform Push { uint rows, width, classes, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.classes) return;
  uint n = i / p.classes, c = i % p.classes;
  float sum = 0.0;
  if (n < min(count, p.rows)) {
    uint row = n * p.width, chosen = critical[c] * p.width;
    for (uint k = 0u; k < p.width; ++k) sum += float(q[row + k]) * float(q[chosen + k]);
    sum /= sqrt(float(p.width));
  }
  s[i] = ACT(sum);
}
