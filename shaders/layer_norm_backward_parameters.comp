#version 450
// LayerNorm's parameter gradients: dweight[c] += sum over rows of dy * xhat, dbias[c] += sum of
// dy, with xhat = (x - mean) * inverse_std from forward's saved statistics. Workgroups of 16
// neighbouring columns whose 16 slices share the rows (bag_rows.glsl): a TransMIL sequence of
// 110,000 rows loops 6,875 times an invocation, within llvmpipe's 65,535, in a fixed order.
// x and dy are read as storage buffers: through fp32 texel views this ran at a third of the
// speed on llvmpipe (0.45 s against 0.21 s for [60000, 512]; fp16 texels 0.11 s against 0.21 s
// for [110000, 256]), where storage reads cost the same in both precisions.
#include "common.glsl"
#include "bag_rows.glsl"
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(binding = 1) uniform samplerBuffer statistics;  // [rows, 2]: mean, inverse std
layout(std430, binding = 2) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 3) buffer DWeight { float dweight[]; };
layout(std430, binding = 4) buffer DBias { float dbias[]; };
layout(push_constant) uniform Push { uint rows, width; } p;
void main() {
  uint c = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  float weight_sum = 0.0, bias_sum = 0.0;
  if (c < p.width)
    for (uint n = bag_slice(); n < p.rows; n += BAG_SLICES) {
      vec2 row = vec2(texelFetch(statistics, int(2u * n)).x, texelFetch(statistics, int(2u * n + 1u)).x);
      float g = float(dy[n * p.width + c]);
      weight_sum += g * (float(x[n * p.width + c]) - row.x) * row.y;
      bias_sum += g;
    }
  weight_sum = bag_slices_sum(weight_sum);
  bias_sum = bag_slices_sum(bias_sum);
  if (bag_slice() == 0u && c < p.width) {
    dweight[c] += weight_sum;
    dbias[c] += bias_sum;
  }
}
