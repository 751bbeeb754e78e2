#version 450
// Backward of nystrom_pinv_init: with z0 = s x^T, s = 1 / (r c) (r the largest row sum, c the
// largest column sum of |x|, x > 0 a softmax), dx += s dz0^T, and the column that gave c adds
// -ds s / c to each of its entries, ds = sum dz0 * x^T. The row maximum's share is left out: the
// rows of a softmax sum to 1, so the softmax's backward cancels a gradient equal along a row.
// One workgroup.
#include "common.glsl"
layout(local_size_x = 256) in;
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Dz { float dz[]; };
layout(std430, binding = 2) readonly buffer Scales { float scales[]; };
layout(std430, binding = 3) buffer Dx { float dx[]; };
layout(push_constant) uniform Push {
  uint heads, side, dz_offset;  // dz0 from this element of dz on
} p;

void main() {
  uint t = gl_LocalInvocationID.x, side = p.side, size = p.heads * side * side;
  float partial = 0.0;
  for (uint e = t; e < size; e += 256u) {
    uint head = e / (side * side), i = e / side % side, j = e % side;
    partial += dz[p.dz_offset + e] * x[(head * side + j) * side + i];
  }
  float ds = workgroup_sum(vec2(partial, 0.0)).x;
  float scale = 1.0 / (scales[0] * scales[1]);
  float column_share = -ds * scale / scales[1];
  uint column_at = uint(scales[2]);
  for (uint e = t; e < size; e += 256u) {
    uint head = e / (side * side), i = e / side % side, j = e % side;
    float share = scale * dz[p.dz_offset + (head * side + j) * side + i];
    if (head * side + j == column_at) share += column_share;
    dx[e] += share;
  }
}
