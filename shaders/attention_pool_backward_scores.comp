#version 450
// ds[n] (+)= a[n] (g[n] - sum over m < count of a[m] g[m]), the softmax's backward; 0 for padding
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer DS { ACT ds[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint n = global_index();
  if (n >= p.rows) return;
  uint instances = min(count, p.rows);
  float expected = 0.0;
  for (uint m = 0; m < instances; ++m) expected += a[m] * g[m];
  float grad = n < instances ? a[n] * (g[n] - expected) : 0.0;
  ds[n] = ACT(p.accumulate != 0u ? float(ds[n]) + grad : grad);
}
