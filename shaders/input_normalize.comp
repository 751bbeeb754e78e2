#version 450
// Images as they arrive from the loader to the network's input:
// uint8 [N,H,W,C] (packed four to a word) -> x float [N,C,H,W] = (v/255 - mean[c]) / std[c], with
// per-channel statistics for RGB (C = 3) and mean[0], std[0] for every channel otherwise.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer RGB { uint rgb[]; };
layout(std430, binding = 1) writeonly buffer X { ACT x[]; };
layout(push_constant) uniform Push {
  uint count;  // N*C*H*W
  uint height, width, channels;
  vec4 mean, inv_std;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint plane = p.height * p.width;
  uint n = i / (p.channels * plane), c = (i / plane) % p.channels, pixel = i % plane;
  uint byte_index = (n * plane + pixel) * p.channels + c;
  float value = float((rgb[byte_index >> 2] >> (8u * (byte_index & 3u))) & 0xffu) / 255.0;
  uint k = p.channels == 3u ? c : 0u;
  x[i] = ACT((value - p.mean[k]) * p.inv_std[k]);
}
