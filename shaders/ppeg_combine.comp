#version 450
// PPEG's three depthwise kernels as one 7x7 kernel a channel (the 5x5 and the 3x3 centred in
// it; zero padding k/2 keeps every one centred on its pixel) and their three biases summed:
// combined [D, 50], taps 0..48 the kernel, 49 the bias. Forward and the input gradient read it.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer W7 { float w7[]; };
layout(std430, binding = 1) readonly buffer B7 { float b7[]; };
layout(std430, binding = 2) readonly buffer W5 { float w5[]; };
layout(std430, binding = 3) readonly buffer B5 { float b5[]; };
layout(std430, binding = 4) readonly buffer W3 { float w3[]; };
layout(std430, binding = 5) readonly buffer B3 { float b3[]; };
layout(std430, binding = 6) writeonly buffer Combined { float combined[]; };
layout(push_constant) uniform Push { uint width, side, accumulate, blocks; } p;
const uint TAPS = 50u, BIAS_TAP = 49u;
void main() {
  uint i = global_index();
  if (i >= p.width * TAPS) return;
  uint c = i / TAPS, tap = i % TAPS;
  if (tap == BIAS_TAP) {
    combined[i] = b7[c] + b5[c] + b3[c];
    return;
  }
  uint ky = tap / 7u, kx = tap % 7u;
  float w = w7[c * 49u + tap];
  // unsigned: a tap left of or above the smaller window wraps past its size
  if (ky - 1u < 5u && kx - 1u < 5u) w += w5[c * 25u + (ky - 1u) * 5u + (kx - 1u)];
  if (ky - 2u < 3u && kx - 2u < 3u) w += w3[c * 9u + (ky - 2u) * 3u + (kx - 2u)];
  combined[i] = w;
}
