#version 450
// dx (+)= y > 0 ? dy : 0, four elements per invocation. Reads the output, not the input:
// forward may run in place.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer y;
layout(binding = 1, ACT_TEXELS) uniform readonly imageBuffer dy;
layout(std430, binding = 2) buffer DX { ACT4 dx[]; };
layout(std430, binding = 2) buffer DXElements { ACT dx_element[]; };  // the same, for the last partial four
layout(push_constant) uniform Push { uint count; uint accumulate; } p;
void main() {
  uint i = global_index(), first = 4 * i;
  if (first >= p.count) return;
  vec4 g;
  for (int j = 0; j < 4; ++j) {
    int at = int(min(first + j, p.count - 1));
    // Both loads unconditional: a load under the condition is a masked branch on lavapipe.
    float gradient = imageLoad(dy, at).x;
    g[j] = texelFetch(y, at).x > 0.0 ? gradient : 0.0;
  }
  if (first + 4 <= p.count) {
    if (p.accumulate != 0u) g += vec4(dx[i]);
    dx[i] = ACT4(g);
  } else {
    for (uint j = 0; first + j < p.count; ++j) dx_element[first + j] = ACT(p.accumulate != 0u ? float(dx_element[first + j]) + g[j] : g[j]);
  }
}
