#version 450
// critical[c] = the first n < count with the largest logits[n, c]. A strict comparison keeps the
// first of equal values, so ties resolve the same way on every run.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Logits { ACT logits[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) writeonly buffer Critical { uint critical[]; };
layout(push_constant) uniform Push { uint rows, width, classes, accumulate; } p;
void main() {
  uint c = global_index();
  if (c >= p.classes) return;
  uint instances = max(min(count, p.rows), 1u);
  uint best = 0u;
  float largest = float(logits[c]);
  for (uint n = 1u; n < instances; ++n) {
    float value = float(logits[n * p.classes + c]);
    if (value > largest) {
      largest = value;
      best = n;
    }
  }
  critical[c] = best;
}
