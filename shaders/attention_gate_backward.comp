#version 450
// da (+)= dy (1 - tanh(a)^2) sigmoid(b); db (+)= dy tanh(a) sigmoid(b) (1 - sigmoid(b))
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, binding = 3) buffer DA { float da[]; };
layout(std430, binding = 4) buffer DB { float db[]; };
layout(push_constant) uniform Push { uint count, accumulate_a, accumulate_b; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float t = tanh(a[i]);
  float s = 1.0 / (1.0 + exp(-b[i]));
  float ga = dy[i] * (1.0 - t * t) * s;
  float gb = dy[i] * t * s * (1.0 - s);
  da[i] = p.accumulate_a != 0u ? da[i] + ga : ga;
  db[i] = p.accumulate_b != 0u ? db[i] + gb : gb;
}
