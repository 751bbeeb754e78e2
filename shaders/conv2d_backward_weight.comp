#version 450
// dweight[o,c,kh,kw] += sum_{n,oh,ow} dy[n,o,oh,ow] x[n,c,oh*s-p+kh,ow*s-p+kw]: an implicit
// GEMM with rows o, columns (c,kh,kw) and the long reduction (n,oh,ow) split into slices
// (workgroup z), so that small weights still spread over the device. Slice z writes its own
// partial sums to out[z,o,c,kh,kw] (summed by conv2d_backward_weight_reduce), or with a single
// slice adds straight into the gradient.
#include "conv2d.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TM = 4;
layout(constant_id = 2) const int TN = 16;
layout(std430, binding = 0) readonly buffer DY { float dy[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) buffer Out { float out_[]; };

// Per column: the channel's offset in an image of x and the tap's offset from the window corner.
uint column_channel[TN];
int column_dh[TN], column_dw[TN];

float a_value(uint o, uint k) {
  uint pixels = p.OH * p.OW;
  return dy[(k / pixels * p.O + o) * pixels + k % pixels];
}
void b_values(uint k, out float v[TN]) {
  uint pixels = p.OH * p.OW, image = k / pixels * p.C * p.H * p.W, pixel = k % pixels;
  int top = int(pixel / p.OW * p.stride), left = int(pixel % p.OW * p.stride);
  for (int j = 0; j < TN; ++j) {
    int ih = top + column_dh[j], iw = left + column_dw[j];
    bool inside = ih >= 0 && ih < int(p.H) && iw >= 0 && iw < int(p.W);
    float value = x[image + column_channel[j] + clamp(ih, 0, int(p.H) - 1) * p.W + clamp(iw, 0, int(p.W) - 1)];
    v[j] = inside ? value : 0.0;
  }
}
#include "gemm_block.glsl"

void main() {
  uint taps = p.KH * p.KW, columns = p.C * taps, reduction = p.batch * p.OH * p.OW;
  uint m0 = gl_WorkGroupID.x * gl_WorkGroupSize.x * TM + gl_LocalInvocationID.x;
  uint n0 = gl_WorkGroupID.y * TN;
  for (int j = 0; j < TN; ++j) {
    uint n = min(n0 + j, columns - 1), tap = n % taps;
    column_channel[j] = n / taps * p.H * p.W;
    column_dh[j] = int(tap / p.KW) - int(p.pad);
    column_dw[j] = int(tap % p.KW) - int(p.pad);
  }
  uint k_begin = gl_WorkGroupID.z * p.k_per_slice;
  accumulate_block(m0, p.O, k_begin, min(k_begin + p.k_per_slice, reduction));
  for (int i = 0; i < TM; ++i) {
    uint o = m0 + i * gl_WorkGroupSize.x;
    if (o >= p.O) break;
    for (int j = 0; j < TN && n0 + j < columns; ++j) {
      uint at = (gl_WorkGroupID.z * p.O + o) * columns + n0 + j;
      out_[at] = p.accumulate != 0u ? out_[at] + acc[i][j] : acc[i][j];
    }
  }
}
