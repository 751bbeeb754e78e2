#version 450
// z[c*D + d] = sum over n < count of a[c, n] h[n, d]: workgroups (blocks of 16 columns d, c),
// the rows shared by 16 slices (bag_rows.glsl)
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer H { ACT h[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer Z { ACT z[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, columns; } p;
void main() {
  uint c = gl_WorkGroupID.y, d = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  uint instances = min(count, p.rows);
  float partial = 0.0;
  if (d < p.width)
    for (uint n = bag_slice(); n < instances; n += BAG_SLICES) partial += a[c * p.rows + n] * float(h[n * p.width + d]);
  float sum = bag_slices_sum(partial);
  if (bag_slice() == 0u && d < p.width) z[c * p.width + d] = ACT(sum);
}
