#version 450
// PPEG's weight gradient, second pass: the blocks' partial sums (ppeg_backward_weight_partial)
// added in block order and accumulated into the three kernels' and biases' gradients: the 7x7
// takes every tap, the 5x5 and 3x3 the taps of their centred windows, each bias the sum of dy.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Partial { float partial[]; };
layout(std430, binding = 1) buffer DW7 { float dw7[]; };
layout(std430, binding = 2) buffer DB7 { float db7[]; };
layout(std430, binding = 3) buffer DW5 { float dw5[]; };
layout(std430, binding = 4) buffer DB5 { float db5[]; };
layout(std430, binding = 5) buffer DW3 { float dw3[]; };
layout(std430, binding = 6) buffer DB3 { float db3[]; };
layout(push_constant) uniform Push { uint width, side, accumulate, blocks; } p;
const uint TAPS = 50u, BIAS_TAP = 49u;
void main() {
  uint i = global_index();
  if (i >= p.width * TAPS) return;
  uint c = i / TAPS, tap = i % TAPS;
  float total = 0.0;
  for (uint block = 0u; block < p.blocks; ++block) total += partial[block * p.width * TAPS + i];
  if (tap == BIAS_TAP) {
    db7[c] += total;
    db5[c] += total;
    db3[c] += total;
    return;
  }
  dw7[c * 49u + tap] += total;
  uint ky = tap / 7u, kx = tap % 7u;
  if (ky - 1u < 5u && kx - 1u < 5u) dw5[c * 25u + (ky - 1u) * 5u + (kx - 1u)] += total;
  if (ky - 2u < 3u && kx - 2u < 3u) dw3[c * 9u + (ky - 2u) * 3u + (kx - 2u)] += total;
}
