#version 450
// dy = y > 0 ? dy : 0 in place, four elements per invocation: the backward of a ReLU fused into
// the op before it, whose output y is the ReLU's (y > 0 exactly where the ReLU's input was).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer y;
layout(std430, binding = 1) buffer DY { ACT4 dy[]; };
layout(std430, binding = 1) buffer DYElements { ACT dy_element[]; };  // the same, for the last partial four
layout(push_constant) uniform Push { uint count; } p;
void main() {
  uint i = global_index(), first = 4 * i;
  if (first >= p.count) return;
  if (first + 4 <= p.count) {
    vec4 g = vec4(dy[i]);
    for (int j = 0; j < 4; ++j) g[j] = texelFetch(y, int(first + j)).x > 0.0 ? g[j] : 0.0;
    dy[i] = ACT4(g);
  } else {
    for (uint j = 0; first + j < p.count; ++j) dy_element[first + j] = ACT(texelFetch(y, int(first + j)).x > 0.0 ? float(dy_element[first + j]) : 0.0);
  }
}
