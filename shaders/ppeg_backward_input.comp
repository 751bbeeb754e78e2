#version 450
// dx of PPEG (ppeg_forward.comp): the class row's dy; on the grid dy plus the transposed
// depthwise convolution, dg[q] = sum_k W[k] dy[q - (k - 3)]; rows past 1 + side^2 get none.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(std430, binding = 2) readonly buffer Combined { float combined[]; };
layout(std430, binding = 3) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push { uint width, side, accumulate, blocks; } p;
void main() {
  uint i = global_index();
  if (i >= (1u + p.side * p.side) * p.width) return;
  uint row = i / p.width, c = i % p.width;
  uint side = transmil_grid_side(min(count, p.side * p.side));
  float g = 0.0;
  if (row == 0u) {
    g = float(dy[i]);
  } else if (row <= side * side) {
    int pixel_row = int((row - 1u) / side), pixel_column = int((row - 1u) % side);
    g = float(dy[i]);
    for (int ky = 0; ky < 7; ++ky) {
      int target_row = pixel_row - ky + 3;
      if (target_row < 0 || target_row >= int(side)) continue;
      for (int kx = 0; kx < 7; ++kx) {
        int target_column = pixel_column - kx + 3;
        if (target_column < 0 || target_column >= int(side)) continue;
        uint target = 1u + uint(target_row) * side + uint(target_column);
        g += combined[c * 50u + uint(ky * 7 + kx)] * float(dy[target * p.width + c]);
      }
    }
  }
  dx[i] = ACT(p.accumulate != 0u ? float(dx[i]) + g : g);
}
