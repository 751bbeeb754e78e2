#version 450
// z[d] = sum over n < count of h[n, d] / count: workgroups of 16 columns d, the rows shared by
// 16 slices (bag_rows.glsl)
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer H { ACT h[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) writeonly buffer Z { ACT z[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;
void main() {
  uint d = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  uint instances = min(count, p.rows);
  float partial = 0.0;
  if (d < p.width)
    for (uint n = bag_slice(); n < instances; n += BAG_SLICES) partial += float(h[n * p.width + d]);
  float sum = bag_slices_sum(partial);
  if (bag_slice() == 0u && d < p.width) z[d] = ACT(sum / float(instances));
}
