#version 450
// z[d] (+)= sum over the window's rows n < count of h[n, d] / count: workgroups of 16 columns d,
// the rows shared by 16 slices (bag_rows.glsl). h is bound from the window's first row on (a bag
// past one binding is pooled a window at a time, each adding to z).
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer H { ACT h[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) buffer Z { ACT z[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, first, window; } p;
void main() {
  uint d = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  uint instances = min(count, p.rows), end = min(instances, p.first + p.window);
  float partial = 0.0;
  if (d < p.width)
    for (uint n = p.first + bag_slice(); n < end; n += BAG_SLICES) partial += float(h[(n - p.first) * p.width + d]);
  float mean = bag_slices_sum(partial) / float(instances);
  if (bag_slice() == 0u && d < p.width) z[d] = ACT(p.accumulate != 0u ? float(z[d]) + mean : mean);
}
