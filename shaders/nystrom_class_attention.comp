#version 450
// Each patch's attention from the class token (nystrom_attention's class_attention output):
// out[r] = the mean over heads of token_attention[h, 1 + r], plus that of its wrapped-around
// copy 1 + n + r where the square's padding repeats it (r < side^2 - n); 0 past the bag's n
// patches. One invocation per patch row.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Tokens { float token_attention[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) writeonly buffer Out { ACT scores[]; };
layout(push_constant) uniform Push {
  uint patches_max, rows, heads;
} p;

void main() {
  uint r = global_index();
  if (r >= p.patches_max) return;
  uint patches = count, side = transmil_grid_side(patches), repeated = side * side - patches;
  float score = 0.0;
  if (r < patches)
    for (uint h = 0u; h < p.heads; ++h) {
      score += token_attention[h * p.rows + 1u + r];
      if (r < repeated) score += token_attention[h * p.rows + 1u + patches + r];
    }
  scores[r] = ACT(score / float(p.heads));
}
