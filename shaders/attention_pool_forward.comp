#version 450
// z[c*D + d] (+)= sum over the window's rows n < count of a[c, n] h[n, d]: workgroups (blocks of
// 16 columns d, c), the rows shared by 16 slices (bag_rows.glsl). h is bound from the window's
// first row on (a bag past one binding is pooled a window at a time, each adding to z).
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer H { ACT h[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer Z { ACT z[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns, first, window; } p;
void main() {
  uint c = gl_WorkGroupID.y, d = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  uint end = min(min(count, p.rows), p.first + p.window);
  float partial = 0.0;
  if (d < p.width)
    for (uint n = p.first + bag_slice(); n < end; n += BAG_SLICES)
      partial += a[c * p.rows + n] * float(h[(n - p.first) * p.width + d]);
  float sum = bag_slices_sum(partial);
  uint at = c * p.width + d;
  if (bag_slice() == 0u && d < p.width) z[at] = ACT(p.accumulate != 0u ? float(z[at]) + sum : sum);
}
