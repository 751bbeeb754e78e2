#version 450
// timm's packed SwiGLU gate (GluMlp with gate_last=False, the SwiGLUPacked of UNI2-h, Virchow2,
// H-optimus and Prov-GigaPath): fc1's output [rows, 2H] splits into halves a | b, and
// y = silu(a) * b, [rows, H]: the first half goes through the activation.
#include "common.glsl"
#include "activations.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer x;
layout(std430, binding = 1) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push { uint count, hidden; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint row = i / p.hidden, column = i - row * p.hidden;
  uint first = row * 2u * p.hidden + column;
  y[i] = ACT(silu(texelFetch(x, int(first)).x) * texelFetch(x, int(first + p.hidden)).x);
}
