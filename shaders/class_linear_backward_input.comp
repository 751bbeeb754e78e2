#version 450
// dx[n, c*D + d] (+)= dy[n, c] weight[c, d]
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) readonly buffer W { float weight[]; };
layout(std430, binding = 2) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push { uint batch, classes, width, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.batch * p.classes * p.width) return;
  uint n = i / (p.classes * p.width), cd = i % (p.classes * p.width);
  uint c = cd / p.width;
  float grad = float(dy[n * p.classes + c]) * weight[cd];
  dx[i] = ACT(p.accumulate != 0u ? float(dx[i]) + grad : grad);
}
