#version 450
// a[c, n] = exp(s[n, c] - max) / sum over the bag (n < count), column c = the workgroup; 0 for
// padding rows. The workgroup's invocations share the rows (bag_rows.glsl).
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer S { ACT s[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) writeonly buffer A { float a[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns; } p;
void main() {
  uint c = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  uint instances = min(count, p.rows);
  float largest = -3.4028235e38;
  for (uint n = t; n < instances; n += BAG_GROUP) largest = max(largest, float(s[n * p.columns + c]));
  largest = bag_max(largest);
  float sum = 0.0;
  for (uint n = t; n < instances; n += BAG_GROUP) sum += exp(float(s[n * p.columns + c]) - largest);
  sum = bag_sum(sum);
  for (uint n = t; n < p.rows; n += BAG_GROUP)
    a[c * p.rows + n] = n < instances ? exp(float(s[n * p.columns + c]) - largest) / sum : 0.0;
}
