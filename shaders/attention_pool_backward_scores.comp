#version 450
// ds[n, c] (+)= a[c, n] (g[c, n] - sum over m < count of a[c, m] g[c, m]), the softmax's
// backward; 0 for padding
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer DS { ACT ds[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns; } p;
void main() {
  uint i = global_index();
  if (i >= p.rows * p.columns) return;
  uint n = i / p.columns, column = (i % p.columns) * p.rows;
  uint instances = min(count, p.rows);
  float expected = 0.0;
  for (uint m = 0; m < instances; ++m) expected += a[column + m] * g[column + m];
  float grad = n < instances ? a[column + n] * (g[column + n] - expected) : 0.0;
  ds[i] = ACT(p.accumulate != 0u ? float(ds[i]) + grad : grad);
}
