#version 450
// Images as they arrive from the loader to the network's input:
// rgb uint8 [N,H,W,3] (packed four to a word) -> x float [N,3,H,W] = (rgb/255 - mean[c]) / std[c].
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer RGB { uint rgb[]; };
layout(std430, binding = 1) writeonly buffer X { ACT x[]; };
layout(push_constant) uniform Push {
  uint count;  // N*3*H*W
  uint height, width;
  vec4 mean, inv_std;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint plane = p.height * p.width;
  uint n = i / (3u * plane), c = (i / plane) % 3u, pixel = i % plane;
  uint byte_index = (n * plane + pixel) * 3u + c;
  float value = float((rgb[byte_index >> 2] >> (8u * (byte_index & 3u))) & 0xffu) / 255.0;
  x[i] = ACT((value - p.mean[c]) * p.inv_std[c]);
}
