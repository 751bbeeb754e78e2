#version 450
// LayerNorm's parameter gradients: dweight[c] += sum over rows of dy * xhat, dbias[c] += sum of
// dy, with xhat = (x - mean) * inverse_std from forward's saved statistics. Workgroups of 16
// neighbouring columns whose 16 slices share the rows (bag_rows.glsl): a TransMIL sequence of
// 110,000 rows loops 6,875 times an invocation, within llvmpipe's 65,535, in a fixed order.
// x and dy are read through texel views, so one kernel serves fp32 and fp16 activations.
#include "bag_rows.glsl"
layout(binding = 0) uniform samplerBuffer x;
layout(binding = 1) uniform samplerBuffer statistics;  // [rows, 2]: mean, inverse std
layout(binding = 2) uniform samplerBuffer dy;
layout(std430, binding = 3) buffer DWeight { float dweight[]; };
layout(std430, binding = 4) buffer DBias { float dbias[]; };
layout(push_constant) uniform Push { uint rows, width; } p;
void main() {
  uint c = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  float weight_sum = 0.0, bias_sum = 0.0;
  if (c < p.width)
    for (uint n = bag_slice(); n < p.rows; n += BAG_SLICES) {
      vec2 row = vec2(texelFetch(statistics, int(2u * n)).x, texelFetch(statistics, int(2u * n + 1u)).x);
      float g = texelFetch(dy, int(n * p.width + c)).x;
      weight_sum += g * (texelFetch(x, int(n * p.width + c)).x - row.x) * row.y;
      bias_sum += g;
    }
  weight_sum = bag_slices_sum(weight_sum);
  bias_sum = bag_slices_sum(bias_sum);
  if (bag_slice() == 0u && c < p.width) {
    dweight[c] += weight_sum;
    dbias[c] += bias_sum;
  }
}
