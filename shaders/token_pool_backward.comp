#version 450
// token_pool's class-token output y [N, D] = x[n, 0]: dx [N, T, D] (+)= dy[n] in token 0, zero
// (nothing added) in the others.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push {
  uint count;  // N * T * D
  uint width, tokens, accumulate;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint d = i % p.width, token = (i / p.width) % p.tokens, n = i / (p.width * p.tokens);
  float g = token == 0u ? float(dy[n * p.width + d]) : 0.0;
  dx[i] = ACT(p.accumulate != 0u ? float(dx[i]) + g : g);
}
