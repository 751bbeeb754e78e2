#version 450
// TransMIL's sequence from a bag h [M, D] of n = count instances: y [S_max, D] = the class token,
// the n instances, then the first side^2 - n instances again (the wrap-around padding to a square,
// cat([h, h[:add]])), then zeros past row 1 + side^2 (transmil_grid.glsl).
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer H { ACT h[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) readonly buffer ClassToken { float class_token[]; };
layout(std430, binding = 3) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push {
  uint rows;  // M, the padded bag
  uint width, sequence_rows, accumulate;
} p;
void main() {
  uint i = global_index();
  if (i >= p.sequence_rows * p.width) return;
  uint row = i / p.width, d = i % p.width;
  uint instances = min(count, p.rows);
  uint side = transmil_grid_side(instances);
  if (row == 0u) {
    y[i] = ACT(class_token[d]);
  } else if (row <= side * side) {
    uint r = row - 1u;
    y[i] = h[(r < instances ? r : r - instances) * p.width + d];
  } else {
    y[i] = ACT(0.0);
  }
}
