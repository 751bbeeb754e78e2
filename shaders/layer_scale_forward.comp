#version 450
// timm's LayerScale: y = x * gamma over the last dimension (width).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer x;
layout(binding = 1, r32f) uniform readonly imageBuffer gamma;
layout(std430, binding = 2) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push { uint count, width; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  y[i] = ACT(texelFetch(x, int(i)).x * imageLoad(gamma, int(i % p.width)).x);
}
