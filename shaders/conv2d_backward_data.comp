#version 450
// dx[n,c,ih,iw] (+)= sum_{o,kh,kw} weight[o,c,kh,kw] dy[n,o,oh,ow] over the (oh,ow) whose
// window covers (ih,iw): oh*s - p + kh = ih. An implicit GEMM: rows c, columns (n,ih,iw),
// reduction (o,kh,kw).
//
// With stride s, only the taps kh with kh = ih + p (mod s) reach a given ih: one dispatch per
// phase (phase_row, phase_col) of the padded input position takes that phase's pixels and its
// taps alone, so a stride-2 3x3 convolution runs 9/4 taps per pixel instead of 9 (and a 1x1
// stride-2 one runs its one tap on a quarter of the pixels, the rest written zero).
#include "common.glsl"
#include "conv2d.glsl"
layout(binding = 0) uniform samplerBuffer dy;
layout(binding = 1, r32f) uniform readonly imageBuffer weight;
layout(std430, binding = 2) buffer DX { ACT dx[]; };

#include "gemm_block.glsl"

// The phase's first input row and column, its rows and columns of pixels, and its taps
// (kh = phase_row + th * s for th < TH).
uint first_row, first_col, phase_h, phase_w, TH, TW;
// Per loaded column: where its image starts in dy and its padded input position (ih + p, iw + p).
uint column_image[B_LOADS];
int column_row[B_LOADS], column_col[B_LOADS];
// The reduction index k as (output channel offset in an image of dy, the offset of
// weight[o,0,kh,kw], th, tw).
uint channel_offset, weight_offset, th, tw;

uint phase_start(uint phase) { return (phase + STRIDE - p.pad % STRIDE) % STRIDE; }
uint phase_count(uint first, uint size) { return first < size ? (size - first + STRIDE - 1) / STRIDE : 0u; }

void seek_reduction(uint k) {
  uint taps = max(TH * TW, 1u);  // a phase without taps has no reduction: its pixels are written zero
  uint o = k / taps, t = k % taps;
  th = t / max(TW, 1u);
  tw = t % max(TW, 1u);
  channel_offset = o * p.OH * p.OW;
  weight_offset = o * p.C * TAPS + (p.phase_row + th * STRIDE) * KW + p.phase_col + tw * STRIDE;
}
void step_reduction() {
  weight_offset += STRIDE;
  if (++tw == TW) {
    tw = 0;
    weight_offset += STRIDE * KW - TW * STRIDE;
    if (++th == TH) {
      th = 0;
      channel_offset += p.OH * p.OW;
      weight_offset += p.C * TAPS - TH * STRIDE * KW;
    }
  }
}
float a_value(uint c, uint k) { return imageLoad(weight, int(weight_offset + c * TAPS)).x; }
void b_values(uint k, out float v[B_LOADS]) {
  uint kh = p.phase_row + th * STRIDE, kw = p.phase_col + tw * STRIDE;
  for (int j = 0; j < B_LOADS; ++j) {
    int row = column_row[j] - int(kh), col = column_col[j] - int(kw);  // oh*s, ow*s: multiples of s
    uint oh = uint(max(row, 0)) / STRIDE, ow = uint(max(col, 0)) / STRIDE;
    bool hit = row >= 0 && col >= 0 && oh < p.OH && ow < p.OW;
    float value = texelFetch(dy, int(column_image[j] + channel_offset + min(oh, p.OH - 1) * p.OW + min(ow, p.OW - 1))).x;
    v[j] = hit ? value : 0.0;
  }
}

void main() {
  first_row = phase_start(p.phase_row);
  first_col = phase_start(p.phase_col);
  phase_h = phase_count(first_row, p.H);
  phase_w = phase_count(first_col, p.W);
  TH = p.phase_row < KH ? (KH - p.phase_row + STRIDE - 1) / STRIDE : 0u;
  TW = p.phase_col < KW ? (KW - p.phase_col + STRIDE - 1) / STRIDE : 0u;
  uint pixels = phase_h * phase_w, columns = p.batch * pixels;
  uint m0 = gl_WorkGroupID.x * gl_WorkGroupSize.x * TM + gl_LocalInvocationID.x;
  uint n0 = block_first_column();
  if (n0 >= columns) return;  // the whole workgroup: column_groups may round the grid up
  for (int j = 0; j < B_LOADS; ++j) {
    uint n = min(loaded_column(n0, j), columns - 1), pixel = n % pixels;
    column_image[j] = n / pixels * p.O * p.OH * p.OW;
    column_row[j] = int(first_row + pixel / phase_w * STRIDE + p.pad);
    column_col[j] = int(first_col + pixel % phase_w * STRIDE + p.pad);
  }
  accumulate_block(m0, p.C, 0, p.O * TH * TW);
  uint image_pixels = p.H * p.W;
  for (int i = 0; i < TM; ++i) {
    uint c = m0 + i * gl_WorkGroupSize.x;
    for (int j = 0; j < TN; ++j) {
      uint n = n0 + j, pixel = n % pixels;
      uint ih = first_row + pixel / phase_w * STRIDE, iw = first_col + pixel % phase_w * STRIDE;
      uint at = (n / pixels * p.C + c) * image_pixels + ih * p.W + iw;
      if (c < p.C && n < columns) dx[at] = ACT(p.accumulate != 0u ? float(dx[at]) + acc[i][j] : acc[i][j]);
    }
  }
}
