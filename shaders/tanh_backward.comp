#version 450
// dx (+)= dy (1 - y^2), from the output y = tanh(x)
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Y { ACT y[]; };
layout(std430, binding = 1) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 2) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push { uint count, accumulate; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float value = float(y[i]), grad = float(dy[i]) * (1.0 - value * value);
  dx[i] = ACT(p.accumulate != 0u ? float(dx[i]) + grad : grad);
}
