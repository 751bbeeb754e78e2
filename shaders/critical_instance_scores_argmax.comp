#version 450
// critical[c] = the first n < count with the largest logits[n, c]: workgroups of 16 classes, the
// rows shared by 16 slices (bag_rows.glsl). Strict comparisons in each slice and the lowest row
// among equal values across them keep the first of equal values, so ties resolve the same way
// on every run.
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer Logits { ACT logits[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) writeonly buffer Critical { uint critical[]; };
layout(push_constant) uniform Push { uint rows, width, classes, accumulate; } p;
void main() {
  uint c = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  uint instances = max(min(count, p.rows), 1u);
  float largest = 0.0;
  uint best = NO_ROW;
  if (c < p.classes)
    for (uint n = bag_slice(); n < instances; n += BAG_SLICES) {
      float value = float(logits[n * p.classes + c]);
      if (best == NO_ROW || value > largest) {
        largest = value;
        best = n;
      }
    }
  bag_slices_argmax(largest, best);
  if (bag_slice() == 0u && c < p.classes) critical[c] = best;
}
