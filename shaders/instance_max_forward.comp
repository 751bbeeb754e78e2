#version 450
// argmax[d] = the first n < count with the largest h[n, d]; z[d] = h[argmax[d], d]: workgroups
// of 16 columns d, the rows shared by 16 slices (bag_rows.glsl). Strict comparisons in each
// slice and the lowest row among equal values across them keep the first of equal values, so
// ties resolve the same way on every run. h is bound from the window's first row on: a bag past
// one binding is taken a window at a time, a later window's maximum replacing z only where
// strictly larger (its rows come after those already seen).
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer H { ACT h[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) buffer Argmax { uint argmax[]; };
layout(std430, binding = 3) buffer Z { ACT z[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate, first, window; } p;
void main() {
  uint d = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  uint end = min(max(min(count, p.rows), 1u), p.first + p.window);
  float largest = 0.0;
  uint best = NO_ROW;
  if (d < p.width)
    for (uint n = p.first + bag_slice(); n < end; n += BAG_SLICES) {
      float value = float(h[(n - p.first) * p.width + d]);
      if (best == NO_ROW || value > largest) {
        largest = value;
        best = n;
      }
    }
  bag_slices_argmax(largest, best);
  if (bag_slice() == 0u && d < p.width && best != NO_ROW && (p.accumulate == 0u || largest > float(z[d]))) {
    argmax[d] = best;
    z[d] = h[(best - p.first) * p.width + d];
  }
}
