#version 450
// state[3] = 1 where any grad[i] is NaN or infinite (PyTorch's found_inf): the optimizer then
// skips the step. Every invocation that finds one writes the same value, so no atomics.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer grad;
layout(std430, binding = 1) buffer State { float state[]; };
layout(push_constant) uniform Push { uint count; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float g = texelFetch(grad, int(i)).x;
  if (isnan(g) || isinf(g)) state[3] = 1.0;
}
