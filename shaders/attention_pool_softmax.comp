#version 450
// a[c, n] = exp(s[n, c] - max) / sum over the bag (n < count), column c = the workgroup; 0 for
// padding rows
#include "common.glsl"
layout(local_size_x = 1) in;
layout(std430, binding = 0) readonly buffer S { ACT s[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) writeonly buffer A { float a[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns; } p;
void main() {
  uint c = gl_WorkGroupID.x;
  uint instances = min(count, p.rows);
  float largest = float(s[c]);
  for (uint n = 1; n < instances; ++n) largest = max(largest, float(s[n * p.columns + c]));
  float sum = 0.0;
  for (uint n = 0; n < instances; ++n) sum += exp(float(s[n * p.columns + c]) - largest);
  for (uint n = 0; n < p.rows; ++n)
    a[c * p.rows + n] = n < instances ? exp(float(s[n * p.columns + c]) - largest) / sum : 0.0;
}
