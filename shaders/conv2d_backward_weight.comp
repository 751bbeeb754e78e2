#version 450
// dweight[o,c,kh,kw] += sum_{n,oh,ow} dy[n,o,oh,ow] x[n,c,oh*s-p+kh,ow*s-p+kw]: an implicit
// GEMM with rows o, columns (c,kh,kw) and the long reduction (n,oh,ow) split into slices
// (workgroup z), so that small weights still spread over the device. Slice z writes its own
// partial sums to out[z,o,c,kh,kw] (summed by conv2d_backward_weight_reduce), or with a single
// slice adds straight into the gradient.
#include "common.glsl"
#include "conv2d.glsl"
layout(binding = 0) uniform samplerBuffer dy;
layout(binding = 1, ACT_TEXELS) uniform readonly imageBuffer x;  // the input's type picks the variant
layout(std430, binding = 2) buffer Out { float out_[]; };

#include "gemm_block.glsl"

// Per loaded column: the channel's offset in an image of x and the tap's offset from the window corner.
uint column_channel[B_LOADS];
int column_dh[B_LOADS], column_dw[B_LOADS];
// The reduction index k as (where its image starts in dy and in x, oh, ow).
uint dy_image, x_image, oh, ow;

void seek_reduction(uint k) {
  uint pixels = p.OH * p.OW;
  dy_image = k / pixels * p.O * pixels;
  x_image = k / pixels * p.C * p.H * p.W;
  oh = k % pixels / p.OW;
  ow = k % p.OW;
}
void step_reduction() {
  if (++ow == p.OW) {
    ow = 0;
    if (++oh == p.OH) {
      oh = 0;
      dy_image += p.O * p.OH * p.OW;
      x_image += p.C * p.H * p.W;
    }
  }
}
float a_value(uint o, uint k) { return texelFetch(dy, int(dy_image + (o * p.OH + oh) * p.OW + ow)).x; }
void b_values(uint k, out float v[B_LOADS]) {
  int top = int(oh * STRIDE), left = int(ow * STRIDE);
  for (int j = 0; j < B_LOADS; ++j) {
    int ih = top + column_dh[j], iw = left + column_dw[j];
    bool inside = ih >= 0 && ih < int(p.H) && iw >= 0 && iw < int(p.W);
    float value =
        imageLoad(x, int(x_image + column_channel[j] + clamp(ih, 0, int(p.H) - 1) * p.W + clamp(iw, 0, int(p.W) - 1))).x;
    v[j] = inside ? value : 0.0;
  }
}

void main() {
  uint columns = p.C * TAPS, reduction = p.batch * p.OH * p.OW;
  uint m0 = gl_WorkGroupID.x * gl_WorkGroupSize.x * TM + gl_LocalInvocationID.x;
  uint n0 = gl_WorkGroupID.y * TN;
  for (int j = 0; j < B_LOADS; ++j) {
    uint n = min(loaded_column(n0, j), columns - 1), tap = n % TAPS;
    column_channel[j] = n / TAPS * p.H * p.W;
    column_dh[j] = int(tap / KW) - int(p.pad);
    column_dw[j] = int(tap % KW) - int(p.pad);
  }
  uint k_begin = gl_WorkGroupID.z * p.k_per_slice;
  accumulate_block(m0, p.O, k_begin, min(k_begin + p.k_per_slice, reduction));
  for (int i = 0; i < TM; ++i) {
    uint o = m0 + i * gl_WorkGroupSize.x;
    for (int j = 0; j < TN; ++j) {
      uint at = (gl_WorkGroupID.z * p.O + o) * columns + n0 + j;
      if (o < p.O && n0 + j < columns) out_[at] = p.accumulate != 0u ? out_[at] + acc[i][j] : acc[i][j];
    }
  }
}
