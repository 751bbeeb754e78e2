#version 450
// A ViT's output from its tokens x [N, T, D]: MODE 0 the class token, [N, D]; 1 the class token
// joined with the mean of the patch tokens (Virchow2), [N, 2D]; 2 the mean of the patch tokens,
// [N, D]. Patch tokens are those after the prefix (class and register tokens).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int MODE = 0;
layout(binding = 0) uniform samplerBuffer x;
layout(std430, binding = 1) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push {
  uint count;  // N * output width
  uint width, tokens, prefix;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint columns = MODE == 1 ? 2u * p.width : p.width;
  uint n = i / columns, column = i % columns;
  uint first = n * p.tokens * p.width;
  if (MODE == 0 || (MODE == 1 && column < p.width)) {
    y[i] = ACT(texelFetch(x, int(first + column)).x);
    return;
  }
  uint d = column % p.width;
  float sum = 0.0;
  for (uint t = p.prefix; t < p.tokens; ++t) sum += texelFetch(x, int(first + t * p.width + d)).x;
  y[i] = ACT(sum / float(p.tokens - p.prefix));
}
