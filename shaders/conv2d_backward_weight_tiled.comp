#version 450
// conv2d_backward_weight.comp for GPUs: dweight[o,c,kh,kw] += sum_{n,oh,ow} dy[n,o,oh,ow]
// x[n,c,oh*s-p+kh,ow*s-p+kw] in shared-memory tiles (gemm_tiled.glsl): rows o, columns
// (c,kh,kw), the reduction (n,oh,ow) split into slices (workgroup z) with the same partial sums.
#include "conv2d_tiled.glsl"
const bool A_K_FAST = true;   // dy's pixels are contiguous
const bool B_N_FAST = false;  // and so are x's, along the reduction
layout(binding = 0) uniform samplerBuffer dy;
layout(binding = 1) uniform samplerBuffer x;
layout(std430, binding = 2) buffer Out { float out_[]; };

#include "gemm_tiled.glsl"

uint a_row[A_LOADS];
void a_slot(int s, uint o) { a_row[s] = o * p.OH * p.OW; }
float a_value(int s, uint k) {
  uint pixels = p.OH * p.OW, image = k / pixels;
  return texelFetch(dy, int(image * p.O * pixels + a_row[s] + (k - image * pixels))).x;
}

// Per slot: its column's channel offset in an image of x and its tap's offset from the window corner.
uint column_channel[B_LOADS];
int column_dh[B_LOADS], column_dw[B_LOADS];
void b_slot(int s, uint n) {
  uint tap = n % TAPS;
  column_channel[s] = n / TAPS * p.H * p.W;
  column_dh[s] = int(tap / KW) - int(p.pad);
  column_dw[s] = int(tap % KW) - int(p.pad);
}
float b_value(int s, uint k) {
  uint pixels = p.OH * p.OW, image = k / pixels, pixel = k - image * pixels;
  int ih = int(pixel / p.OW * STRIDE) + column_dh[s], iw = int(pixel % p.OW * STRIDE) + column_dw[s];
  bool inside = ih >= 0 && ih < int(p.H) && iw >= 0 && iw < int(p.W);
  uint at = image * p.C * p.H * p.W + column_channel[s] + clamp(ih, 0, int(p.H) - 1) * p.W + clamp(iw, 0, int(p.W) - 1);
  float value = texelFetch(x, int(at)).x;
  return inside ? value : 0.0;
}

void main() {
  uint columns = p.C * TAPS, reduction = p.batch * p.OH * p.OW;
  uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN, k_begin = gl_WorkGroupID.z * p.k_per_slice;
  multiply_block(m0, n0, p.O, columns, k_begin, min(k_begin + p.k_per_slice, reduction));
  for (int i = 0; i < TM; ++i) {
    uint o = m0 + tile_row(i);
    for (int j = 0; j < TN; ++j) {
      uint n = n0 + tile_column(j), at = (gl_WorkGroupID.z * p.O + o) * columns + n;
      if (o < p.O && n < columns) out_[at] = p.accumulate != 0u ? out_[at] + acc[i][j] : acc[i][j];
    }
  }
}
