#version 450
// y[n,o,oh,ow] = bias[o] + sum_{c,kh,kw} weight[o,c,kh,kw] x[n,c,oh*s-p+kh,ow*s-p+kw]
// as an implicit GEMM: rows o, columns (n,oh,ow), reduction (c,kh,kw); x is never unfolded.
// FOLD: the weight arrives scaled by the batch norm's scale s[o] = gamma[o] / sqrt(var[o] + eps)
// (conv2d_forward_weight.comp) and the epilogue adds bias[o] s[o] + beta[o] - mean[o] s[o];
// Then the rest of the epilogue fused in (epilogue.glsl).
#include "common.glsl"
#include "conv2d.glsl"
layout(binding = 0) uniform samplerBuffer x;
layout(binding = 1, r32f) uniform readonly imageBuffer weight_blocked;  // see WEIGHT_BLOCK
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };  // unread without has_bias
layout(std430, binding = 3) writeonly buffer Y { ACT y[]; };
// The folded batch norm's weight (gamma), bias (beta), running mean and variance; unread without FOLD.
layout(std430, binding = 4) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 5) readonly buffer Beta { float beta[]; };
layout(std430, binding = 6) readonly buffer Mean { float running_mean[]; };
layout(std430, binding = 7) readonly buffer Var { float running_var[]; };
#define EPILOGUE_CONSTANT 8
#define EPILOGUE_BINDING 8
#include "epilogue.glsl"

#include "gemm_block.glsl"

// Per loaded column: where its image starts in x and its window's top-left corner.
uint column_image[B_LOADS];
int column_top[B_LOADS], column_left[B_LOADS];
// The reduction index k as (channel offset in an image of x, kh, kw).
uint channel_offset, kh, kw;

void seek_reduction(uint k) {
  channel_offset = k / TAPS * p.H * p.W;
  kh = k % TAPS / KW;
  kw = k % KW;
}
void step_reduction() {
  if (++kw == KW) {
    kw = 0;
    if (++kh == KH) {
      kh = 0;
      channel_offset += p.H * p.W;
    }
  }
}
float a_value(uint o, uint k) {
  return imageLoad(weight_blocked, int(((k / WEIGHT_BLOCK) * p.O + o) * WEIGHT_BLOCK + k % WEIGHT_BLOCK)).x;
}
void b_values(uint k, out float v[B_LOADS]) {
  for (int j = 0; j < B_LOADS; ++j) {
    int ih = column_top[j] + int(kh), iw = column_left[j] + int(kw);
    bool inside = ih >= 0 && ih < int(p.H) && iw >= 0 && iw < int(p.W);
    // A clamped address and a select: a branch around the load would diverge.
    float value =
        texelFetch(x, int(column_image[j] + channel_offset + clamp(ih, 0, int(p.H) - 1) * p.W + clamp(iw, 0, int(p.W) - 1))).x;
    v[j] = inside ? value : 0.0;
  }
}

void main() {
  uint pixels = p.OH * p.OW, columns = p.batch * pixels;
  uint m0 = gl_WorkGroupID.x * gl_WorkGroupSize.x * TM + gl_LocalInvocationID.x;
  uint n0 = block_first_column();
  for (int j = 0; j < B_LOADS; ++j) {
    uint n = min(loaded_column(n0, j), columns - 1), pixel = n % pixels;
    column_image[j] = n / pixels * p.C * p.H * p.W;
    column_top[j] = int(pixel / p.OW * STRIDE) - int(p.pad);
    column_left[j] = int(pixel % p.OW * STRIDE) - int(p.pad);
  }
  accumulate_block(m0, p.O, 0, p.C * TAPS);
  for (int i = 0; i < TM; ++i) {
    uint o = m0 + i * gl_WorkGroupSize.x;
    uint row = min(o, p.O - 1);
    float shift = p.has_bias != 0u ? bias[row] : 0.0;
    if (FOLD) {
      float scale = gamma[row] * inversesqrt(running_var[row] + p.eps);
      shift = shift * scale + beta[row] - running_mean[row] * scale;
    }
    for (int j = 0; j < TN; ++j) {
      uint n = n0 + j;
      uint at = (n / pixels * p.O + o) * pixels + n % pixels;
      if (o < p.O && n < columns) y[at] = ACT(epilogue(acc[i][j] + shift, o, at));
    }
  }
}
