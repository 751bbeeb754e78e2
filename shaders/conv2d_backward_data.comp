#version 450
// dx[n,c,ih,iw] (+)= sum_{o,kh,kw} weight[o,c,kh,kw] dy[n,o,oh,ow] over the (oh,ow) whose
// window covers (ih,iw): oh*s - p + kh = ih. An implicit GEMM: rows c, columns (n,ih,iw),
// reduction (o,kh,kw).
#include "conv2d.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TM = 4;
layout(constant_id = 2) const int TN = 16;
layout(std430, binding = 0) readonly buffer DY { float dy[]; };
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, binding = 2) buffer DX { float dx[]; };

// Per column: the image's offset in dy and the padded input position.
uint column_image[TN];
int column_row[TN], column_col[TN];

float a_value(uint c, uint k) {
  uint taps = p.KH * p.KW;
  return weight[(k / taps * p.C + c) * taps + k % taps];
}
void b_values(uint k, out float v[TN]) {
  uint taps = p.KH * p.KW, o = k / taps, kh = (k % taps) / p.KW, kw = k % p.KW;
  int s = int(p.stride);
  for (int j = 0; j < TN; ++j) {
    int row = column_row[j] - int(kh), col = column_col[j] - int(kw);  // oh*s, ow*s
    int oh = row / s, ow = col / s;
    bool hit = row >= 0 && col >= 0 && row % s == 0 && col % s == 0 && oh < int(p.OH) && ow < int(p.OW);
    float value = dy[column_image[j] + (o * p.OH + clamp(oh, 0, int(p.OH) - 1)) * p.OW + clamp(ow, 0, int(p.OW) - 1)];
    v[j] = hit ? value : 0.0;
  }
}
#include "gemm_block.glsl"

void main() {
  uint pixels = p.H * p.W, columns = p.batch * pixels;
  uint m0 = gl_WorkGroupID.x * gl_WorkGroupSize.x * TM + gl_LocalInvocationID.x;
  uint n0 = block_first_column();
  for (int j = 0; j < TN; ++j) {
    uint n = min(n0 + j, columns - 1), pixel = n % pixels;
    column_image[j] = n / pixels * p.O * p.OH * p.OW;
    column_row[j] = int(pixel / p.W + p.pad);
    column_col[j] = int(pixel % p.W + p.pad);
  }
  accumulate_block(m0, p.C, 0, p.O * p.KH * p.KW);
  for (int i = 0; i < TM; ++i) {
    uint c = m0 + i * gl_WorkGroupSize.x;
    if (c >= p.C) break;
    for (int j = 0; j < TN && n0 + j < columns; ++j) {
      uint n = n0 + j, at = (n / pixels * p.C + c) * pixels + n % pixels;
      dx[at] = p.accumulate != 0u ? dx[at] + acc[i][j] : acc[i][j];
    }
  }
}
