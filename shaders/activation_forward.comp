#version 450
// y = f(x), four elements per invocation: FUNCTION 0 is GELU in PyTorch's default (erf)
// form, x/2 (1 + erf(x/sqrt(2))); 1 is SiLU, x / (1 + exp(-x)).
#include "common.glsl"
#include "activations.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int FUNCTION = 0;
layout(binding = 0) uniform samplerBuffer x;
layout(std430, binding = 1) writeonly buffer Y { ACT4 y[]; };
layout(std430, binding = 1) writeonly buffer YElements { ACT y_element[]; };  // the same, for the last partial four
layout(push_constant) uniform Push { uint count; } p;
void main() {
  uint i = global_index(), first = 4 * i;
  if (first >= p.count) return;
  vec4 v;
  for (int j = 0; j < 4; ++j) {
    float value = texelFetch(x, int(min(first + j, p.count - 1))).x;
    v[j] = FUNCTION == 0 ? gelu(value) : silu(value);
  }
  if (first + 4 <= p.count) {
    y[i] = ACT4(v);
  } else {
    for (uint j = 0; first + j < p.count; ++j) y_element[first + j] = ACT(v[j]);
  }
}
