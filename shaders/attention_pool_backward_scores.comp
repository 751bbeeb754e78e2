#version 450
// ds[n, c] (+)= a[c, n] (g[c, n] - sum over m < count of a[c, m] g[c, m]), the softmax's
// backward; 0 for padding. Column c = the workgroup, whose invocations share the rows
// (bag_rows.glsl): the sum is taken once a column.
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer DS { ACT ds[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns; } p;
void main() {
  uint c = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, column = c * p.rows;
  uint instances = min(count, p.rows);
  float expected = 0.0;
  for (uint m = t; m < instances; m += BAG_GROUP) expected += a[column + m] * g[column + m];
  expected = bag_sum(expected);
  for (uint n = t; n < p.rows; n += BAG_GROUP) {
    float grad = n < instances ? a[column + n] * (g[column + n] - expected) : 0.0;
    uint i = n * p.columns + c;
    ds[i] = ACT(p.accumulate != 0u ? float(ds[i]) + grad : grad);
  }
}
