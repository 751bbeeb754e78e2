#version 450
// dx[n,c,ih,iw] (+)= sum_{o,kh,kw} weight[o,c,kh,kw] dy[n,o,oh,ow] over the (oh,ow) whose
// window covers (ih,iw): oh*s - p + kh = ih. An implicit GEMM: rows c, columns (n,ih,iw),
// reduction (o,kh,kw).
#include "common.glsl"
#include "conv2d.glsl"
layout(binding = 0) uniform samplerBuffer dy;
layout(binding = 1) uniform samplerBuffer weight;
layout(std430, binding = 2) buffer DX { ACT dx[]; };

#include "gemm_block.glsl"

// Per loaded column: where its image starts in dy and its padded input position (ih + p, iw + p).
uint column_image[B_LOADS];
int column_row[B_LOADS], column_col[B_LOADS];
// The reduction index k as (output channel offset in an image of dy, the offset of
// weight[o,0,kh,kw], kh, kw).
uint channel_offset, weight_offset, kh, kw;

void seek_reduction(uint k) {
  channel_offset = k / TAPS * p.OH * p.OW;
  weight_offset = k / TAPS * p.C * TAPS + k % TAPS;
  kh = k % TAPS / KW;
  kw = k % KW;
}
void step_reduction() {
  ++weight_offset;
  if (++kw == KW) {
    kw = 0;
    if (++kh == KH) {
      kh = 0;
      channel_offset += p.OH * p.OW;
      weight_offset += (p.C - 1) * TAPS;
    }
  }
}
float a_value(uint c, uint k) { return texelFetch(weight, int(weight_offset + c * TAPS)).x; }
void b_values(uint k, out float v[B_LOADS]) {
  for (int j = 0; j < B_LOADS; ++j) {
    int row = column_row[j] - int(kh), col = column_col[j] - int(kw);  // oh*s, ow*s
    uint oh = uint(max(row, 0)) / STRIDE, ow = uint(max(col, 0)) / STRIDE;
    bool hit = row >= 0 && col >= 0 && oh * STRIDE == uint(row) && ow * STRIDE == uint(col) && oh < p.OH && ow < p.OW;
    float value = texelFetch(dy, int(column_image[j] + channel_offset + min(oh, p.OH - 1) * p.OW + min(ow, p.OW - 1))).x;
    v[j] = hit ? value : 0.0;
  }
}

void main() {
  uint pixels = p.H * p.W, columns = p.batch * pixels;
  uint m0 = gl_WorkGroupID.x * gl_WorkGroupSize.x * TM + gl_LocalInvocationID.x;
  uint n0 = block_first_column();
  for (int j = 0; j < B_LOADS; ++j) {
    uint n = min(loaded_column(n0, j), columns - 1), pixel = n % pixels;
    column_image[j] = n / pixels * p.O * p.OH * p.OW;
    column_row[j] = int(pixel / p.W + p.pad);
    column_col[j] = int(pixel % p.W + p.pad);
  }
  accumulate_block(m0, p.C, 0, p.O * TAPS);
  for (int i = 0; i < TM; ++i) {
    uint c = m0 + i * gl_WorkGroupSize.x;
    for (int j = 0; j < TN; ++j) {
      uint n = n0 + j, at = (n / pixels * p.C + c) * pixels + n % pixels;
      if (c < p.C && n < columns) dx[at] = ACT(p.accumulate != 0u ? float(dx[at]) + acc[i][j] : acc[i][j]);
    }
  }
}
