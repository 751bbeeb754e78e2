#version 450
// conv2d_backward_data.comp for GPUs: dx[n,c,ih,iw] (+)= sum_{o,kh,kw} weight[o,c,kh,kw]
// dy[n,o,oh,ow] over the (oh,ow) whose window covers (ih,iw), one dispatch per phase of the
// stride as there, in shared-memory tiles (gemm_tiled.glsl): rows c, columns (n,ih,iw) of the
// phase, reduction (o,th,tw) over the phase's TH x TW taps (kh = phase_row + th * s), which
// are specialization constants so that the reduction index divides by constants.
#include "common.glsl"
#include "conv2d_tiled.glsl"
layout(constant_id = 9) const uint TH = 3;
layout(constant_id = 10) const uint TW = 3;
// A phase without taps has no reduction (its pixels are written zero): divide by 1 there.
const uint PHASE_TAPS = TH * TW > 0u ? TH * TW : 1u, TAP_COLUMNS = TW > 0u ? TW : 1u;
const bool A_K_FAST = TAPS > 1u;  // along a channel's taps; a 1x1 kernel's channels are contiguous
const bool B_N_FAST = true;       // neighbouring input pixels read neighbouring output pixels
layout(binding = 0) uniform samplerBuffer dy;
layout(binding = 1) uniform samplerBuffer weight;
layout(std430, binding = 2) buffer DX { ACT dx[]; };

#include "gemm_tiled.glsl"

// The phase's first input row and column, its columns of pixels and all its pixels.
uint first_row, first_col, phase_w, phase_pixels;

// Reduction index k as (output channel o, tap kh, kw).
void reduction_tap(uint k, out uint o, out uint kh, out uint kw) {
  uint t = k % PHASE_TAPS;
  o = k / PHASE_TAPS;
  kh = p.phase_row + t / TAP_COLUMNS * STRIDE;
  kw = p.phase_col + t % TAP_COLUMNS * STRIDE;
}

uint a_row[A_LOADS];
void a_slot(int s, uint c) { a_row[s] = c * TAPS; }
float a_value(int s, uint k) {
  uint o, kh, kw;
  reduction_tap(k, o, kh, kw);
  return texelFetch(weight, int(o * p.C * TAPS + a_row[s] + kh * KW + kw)).x;
}

// Per slot: where its column's image starts in dy and its padded input position (ih + p, iw + p).
uint column_image[B_LOADS];
int column_row[B_LOADS], column_col[B_LOADS];
void b_slot(int s, uint n) {
  uint pixel = n % phase_pixels;
  column_image[s] = n / phase_pixels * p.O * p.OH * p.OW;
  column_row[s] = int(first_row + pixel / phase_w * STRIDE + p.pad);
  column_col[s] = int(first_col + pixel % phase_w * STRIDE + p.pad);
}
float b_value(int s, uint k) {
  uint o, kh, kw;
  reduction_tap(k, o, kh, kw);
  int row = column_row[s] - int(kh), col = column_col[s] - int(kw);  // oh*s, ow*s: multiples of s
  uint oh = uint(max(row, 0)) / STRIDE, ow = uint(max(col, 0)) / STRIDE;
  bool hit = row >= 0 && col >= 0 && oh < p.OH && ow < p.OW;
  float value = texelFetch(dy, int(column_image[s] + o * p.OH * p.OW + min(oh, p.OH - 1) * p.OW + min(ow, p.OW - 1))).x;
  return hit ? value : 0.0;
}

uint phase_start(uint phase) { return (phase + STRIDE - p.pad % STRIDE) % STRIDE; }
uint phase_count(uint first, uint size) { return first < size ? (size - first + STRIDE - 1) / STRIDE : 0u; }

void main() {
  first_row = phase_start(p.phase_row);
  first_col = phase_start(p.phase_col);
  phase_w = phase_count(first_col, p.W);
  phase_pixels = phase_count(first_row, p.H) * phase_w;
  uint columns = p.batch * phase_pixels;
  uint m0 = gl_WorkGroupID.x * BM, n0 = tiled_first_column();
  if (n0 >= columns) return;  // the whole workgroup: column_groups may round the grid up
  multiply_block(m0, n0, p.C, columns, 0, p.O * TH * TW);
  for (int i = 0; i < TM; ++i) {
    uint c = m0 + tile_row(i);
    for (int j = 0; j < TN; ++j) {
      uint n = n0 + tile_column(j), pixel = n % phase_pixels;
      uint ih = first_row + pixel / phase_w * STRIDE, iw = first_col + pixel % phase_w * STRIDE;
      uint at = (n / phase_pixels * p.C + c) * p.H * p.W + ih * p.W + iw;
      if (c < p.C && n < columns) dx[at] = ACT(p.accumulate != 0u ? float(dx[at]) + acc[i][j] : acc[i][j]);
    }
  }
}
