#version 450
// da (+)= dy (1 - tanh(a)^2) sigmoid(b); db (+)= dy tanh(a) sigmoid(b) (1 - sigmoid(b))
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { ACT a[]; };
layout(std430, binding = 1) readonly buffer B { ACT b[]; };
layout(std430, binding = 2) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 3) buffer DA { ACT da[]; };
layout(std430, binding = 4) buffer DB { ACT db[]; };
layout(push_constant) uniform Push { uint count, accumulate_a, accumulate_b; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float t = tanh(float(a[i])), g = float(dy[i]);
  float s = 1.0 / (1.0 + exp(-float(b[i])));
  float ga = g * (1.0 - t * t) * s;
  float gb = g * t * s * (1.0 - s);
  da[i] = ACT(p.accumulate_a != 0u ? float(da[i]) + ga : ga);
  db[i] = ACT(p.accumulate_b != 0u ? float(db[i]) + gb : gb);
}
