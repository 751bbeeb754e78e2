#version 450
// gathered[c, k] = sum over n < count of ds[n, c] Q[n, k] / sqrt(K): the gradient that reaches
// the critical instance's query through every instance's score. Workgroups (blocks of 16
// columns k, c), the rows shared by 16 slices (bag_rows.glsl).
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer DS { ACT ds[]; };
layout(std430, binding = 1) readonly buffer Q { ACT q[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer Gathered { float gathered[]; };
layout(push_constant) uniform Push { uint rows, width, classes, accumulate; } p;
void main() {
  uint c = gl_WorkGroupID.y, k = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  uint instances = min(count, p.rows);
  float partial = 0.0;
  if (k < p.width)
    for (uint n = bag_slice(); n < instances; n += BAG_SLICES)
      partial += float(ds[n * p.classes + c]) * float(q[n * p.width + k]);
  float sum = bag_slices_sum(partial);
  if (bag_slice() == 0u && k < p.width) gathered[c * p.width + k] = sum / sqrt(float(p.width));
}
