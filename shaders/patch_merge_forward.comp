#version 450
// Swin's PatchMerging gather (timm 0.5.4): y[n, t, part * C + c] = x[n, (2 oy + dy) * W + 2 ox + dx, c]
// for the output token t = oy * W/2 + ox and the parts x0 (dy 0, dx 0), x1 (1, 0), x2 (0, 1), x3 (1, 1),
// torch.cat([x0, x1, x2, x3], -1)'s order.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer x;
layout(std430, binding = 1) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push {
  uint count;  // N * H/2 * W/2 * 4C
  uint channels, grid_height, grid_width;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint c = i % p.channels, part = (i / p.channels) % 4u, token = i / (4u * p.channels);
  uint half_width = p.grid_width / 2u, half_tokens = (p.grid_height / 2u) * half_width;
  uint n = token / half_tokens, t = token % half_tokens;
  uint row = 2u * (t / half_width) + (part & 1u), column = 2u * (t % half_width) + (part >> 1u);
  uint source = ((n * p.grid_height + row) * p.grid_width + column) * p.channels + c;
  y[i] = ACT(texelFetch(x, int(source)).x);
}
