#version 450
// TransMIL's PPEG on a sequence x [S_max, D]: the class row passes; the side x side grid
// g[c][i][j] = x[1 + i * side + j][c] becomes g + conv7(g) + conv5(g) + conv3(g) + their
// biases, depthwise, stride 1, zero padding (PyTorch's cross-correlation), through the combined
// 7x7 kernel (ppeg_combine.comp); rows past 1 + side^2 are zero.
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer x;  // texels: llvmpipe loads them as vectors
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(binding = 2) uniform samplerBuffer combined;
layout(std430, binding = 3) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push {
  uint width;
  uint side;  // the largest grid's, of S_max = 1 + side^2 rows
  uint accumulate, blocks;
} p;
void main() {
  uint i = global_index();
  if (i >= (1u + p.side * p.side) * p.width) return;
  uint row = i / p.width, c = i % p.width;
  uint side = transmil_grid_side(min(count, p.side * p.side));
  if (row == 0u || row > side * side) {
    y[i] = ACT(row == 0u ? texelFetch(x, int(i)).x : 0.0);
    return;
  }
  int pixel_row = int((row - 1u) / side), pixel_column = int((row - 1u) % side);
  float sum = texelFetch(x, int(i)).x + texelFetch(combined, int(c * 50u + 49u)).x;
  [[unroll]] for (int ky = 0; ky < 7; ++ky) {
    int source_row = pixel_row + ky - 3;
    if (source_row < 0 || source_row >= int(side)) continue;
    [[unroll]] for (int kx = 0; kx < 7; ++kx) {
      int source_column = pixel_column + kx - 3;
      if (source_column < 0 || source_column >= int(side)) continue;
      uint source = 1u + uint(source_row) * side + uint(source_column);
      sum += texelFetch(combined, int(c * 50u) + ky * 7 + kx).x * texelFetch(x, int(source * p.width + c)).x;
    }
  }
  y[i] = ACT(sum);
}
