#version 450
// PPEG's weight gradient, first pass: for the grid's pixels of one block (BLOCK_PIXELS of them,
// up to 100,000 pixels in all) and 16 channels, the correlation of dy with the shifted input,
// dW[c][ky][kx] = sum over pixels q of dy[q][c] g[c][q + (ky - 3, kx - 3)], and the bias's
// sum of dy: partial[block][c][50] (tap 49 the bias). The 16 slices of the workgroup share the
// block's pixels (bag_rows.glsl), so no invocation loops over more than BLOCK_PIXELS / 16 of
// them; ppeg_backward_weight.comp adds the blocks in order. The 5x5 and 3x3 kernels' gradients
// are the centre of the 7x7's, and the three biases' the same sum.
#include "common.glsl"
#include "bag_rows.glsl"
#include "transmil_grid.glsl"
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) readonly buffer X { ACT x[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer Partial { float partial[]; };
layout(push_constant) uniform Push { uint width, side, accumulate, blocks; } p;
const uint BLOCK_PIXELS = 2048u;  // Ppeg::kBlockPixels
void main() {
  uint c = gl_WorkGroupID.x * BAG_LANES + bag_lane();
  uint block = gl_WorkGroupID.y;
  uint side = transmil_grid_side(min(count, p.side * p.side));
  uint pixels = side * side;
  uint first = block * BLOCK_PIXELS, last = min(first + BLOCK_PIXELS, pixels);
  float sums[50];
  for (uint tap = 0u; tap < 50u; ++tap) sums[tap] = 0.0;
  if (c < p.width)
    for (uint q = first + bag_slice(); q < last; q += BAG_SLICES) {
      float gradient = float(dy[(1u + q) * p.width + c]);
      sums[49] += gradient;
      int pixel_row = int(q / side), pixel_column = int(q % side);
      for (int ky = 0; ky < 7; ++ky) {
        int source_row = pixel_row + ky - 3;
        if (source_row < 0 || source_row >= int(side)) continue;
        for (int kx = 0; kx < 7; ++kx) {
          int source_column = pixel_column + kx - 3;
          if (source_column < 0 || source_column >= int(side)) continue;
          uint source = 1u + uint(source_row) * side + uint(source_column);
          sums[ky * 7 + kx] += gradient * float(x[source * p.width + c]);
        }
      }
    }
  for (uint tap = 0u; tap < 50u; ++tap) {
    float total = bag_slices_sum(sums[tap]);
    if (bag_slice() == 0u && c < p.width) partial[(block * p.width + c) * 50u + tap] = total;
  }
}
