#version 450
// y = scale I - x for each of a batch of square matrices from `offset` on (the 7I - xz of moore_penrose_iter_pinv).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
  uint offset, size, side;
  float scale;
} p;

void main() {
  uint e = global_index();
  if (e >= p.size) return;
  uint i = e / p.side % p.side, j = e % p.side;
  y[p.offset + e] = (i == j ? p.scale : 0.0) - x[p.offset + e];
}
