#version 450
// dx of PPEG (ppeg_forward.comp): the class row's dy; on the grid dy plus the transposed
// depthwise convolution, dg[q] = sum_k W[k] dy[q - (k - 3)]; rows past 1 + side^2 get none.
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer dy;  // texels: llvmpipe loads them as vectors
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(binding = 2) uniform samplerBuffer combined;
layout(std430, binding = 3) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push { uint width, side, accumulate, blocks; } p;
void main() {
  uint i = global_index();
  if (i >= (1u + p.side * p.side) * p.width) return;
  uint row = i / p.width, c = i % p.width;
  uint side = transmil_grid_side(min(count, p.side * p.side));
  float g = 0.0;
  if (row == 0u) {
    g = texelFetch(dy, int(i)).x;
  } else if (row <= side * side) {
    int pixel_row = int((row - 1u) / side), pixel_column = int((row - 1u) % side);
    g = texelFetch(dy, int(i)).x;
    [[unroll]] for (int ky = 0; ky < 7; ++ky) {
      int target_row = pixel_row - ky + 3;
      if (target_row < 0 || target_row >= int(side)) continue;
      [[unroll]] for (int kx = 0; kx < 7; ++kx) {
        int target_column = pixel_column - kx + 3;
        if (target_column < 0 || target_column >= int(side)) continue;
        uint target = 1u + uint(target_row) * side + uint(target_column);
        g += texelFetch(combined, int(c * 50u) + ky * 7 + kx).x * texelFetch(dy, int(target * p.width + c)).x;
      }
    }
  }
  dx[i] = ACT(p.accumulate != 0u ? float(dx[i]) + g : g);
}
