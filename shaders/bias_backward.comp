#version 450
// dbias[o] += sum_{n,i} dy[n,o,i] for dy [N,O,pixels]: the bias gradient of conv2d
// (pixels = OH*OW) and of linear (pixels = 1).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { float dy[]; };
layout(std430, binding = 1) buffer DBias { float dbias[]; };
layout(push_constant) uniform Push { uint batch, channels, pixels; } p;
void main() {
  uint o = global_index();
  if (o >= p.channels) return;
  float sum = 0.0;
  for (uint n = 0; n < p.batch; ++n)
    for (uint i = 0; i < p.pixels; ++i) sum += dy[(n * p.channels + o) * p.pixels + i];
  dbias[o] += sum;
}
