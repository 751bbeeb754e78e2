#version 450
// conv2d_forward.comp for GPUs: y[n,o,oh,ow] = bias[o] + sum_{c,kh,kw} weight[o,c,kh,kw]
// x[n,c,oh*s-p+kh,ow*s-p+kw] as an implicit GEMM in shared-memory tiles (gemm_tiled.glsl):
// rows o, columns (n,oh,ow), reduction (c,kh,kw); x is never unfolded. The weight is read
// blocked (conv2d_forward_weight.comp, which scales it for FOLD); the epilogue is the same
// (epilogue.glsl).
#include "common.glsl"
#include "conv2d_tiled.glsl"
layout(constant_id = 9) const uint WEIGHT_BLOCK = 16;
layout(constant_id = 10) const bool FOLD = false;
const bool A_K_FAST = true;  // a block of the weight holds WEIGHT_BLOCK consecutive k of a row
const bool B_N_FAST = true;  // neighbouring output pixels read neighbouring input pixels
layout(binding = 0) uniform samplerBuffer x;
layout(binding = 1) uniform samplerBuffer weight_blocked;
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };  // unread without has_bias
layout(std430, binding = 3) writeonly buffer Y { ACT y[]; };
// The folded batch norm's weight (gamma), bias (beta), running mean and variance; unread without FOLD.
layout(std430, binding = 4) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 5) readonly buffer Beta { float beta[]; };
layout(std430, binding = 6) readonly buffer Mean { float running_mean[]; };
layout(std430, binding = 7) readonly buffer Var { float running_var[]; };
#define EPILOGUE_CONSTANT 11
#define EPILOGUE_BINDING 8
#include "epilogue.glsl"

#include "gemm_tiled.glsl"

uint a_row[A_LOADS];
void a_slot(int s, uint o) { a_row[s] = o * WEIGHT_BLOCK; }
float a_value(int s, uint k) {
  return texelFetch(weight_blocked, int(k / WEIGHT_BLOCK * p.O * WEIGHT_BLOCK + a_row[s] + k % WEIGHT_BLOCK)).x;
}

// Per slot: where its column's image starts in x and its window's top-left corner.
uint column_image[B_LOADS];
int column_top[B_LOADS], column_left[B_LOADS];
void b_slot(int s, uint n) {
  uint pixels = p.OH * p.OW, pixel = n % pixels;
  column_image[s] = n / pixels * p.C * p.H * p.W;
  column_top[s] = int(pixel / p.OW * STRIDE) - int(p.pad);
  column_left[s] = int(pixel % p.OW * STRIDE) - int(p.pad);
}
float b_value(int s, uint k) {
  uint tap = k % TAPS;
  int ih = column_top[s] + int(tap / KW), iw = column_left[s] + int(tap % KW);
  bool inside = ih >= 0 && ih < int(p.H) && iw >= 0 && iw < int(p.W);
  uint at = column_image[s] + k / TAPS * p.H * p.W + clamp(ih, 0, int(p.H) - 1) * p.W + clamp(iw, 0, int(p.W) - 1);
  float value = texelFetch(x, int(at)).x;
  return inside ? value : 0.0;
}

void main() {
  uint pixels = p.OH * p.OW, columns = p.batch * pixels;
  uint m0 = gl_WorkGroupID.x * BM, n0 = tiled_first_column();
  multiply_block(m0, n0, p.O, columns, 0, p.C * TAPS);
  for (int i = 0; i < TM; ++i) {
    uint o = m0 + tile_row(i), row = min(o, p.O - 1);
    float shift = p.has_bias != 0u ? bias[row] : 0.0;
    if (FOLD) {
      float scale = gamma[row] * inversesqrt(running_var[row] + p.eps);
      shift = shift * scale + beta[row] - running_mean[row] * scale;
    }
    for (int j = 0; j < TN; ++j) {
      uint n = n0 + tile_column(j);
      uint at = (n / pixels * p.O + o) * pixels + n % pixels;
      if (o < p.O && n < columns) y[at] = ACT(epilogue(acc[i][j] + shift, o, at));
    }
  }
}
