#version 450
// PPEG's weight gradient, first pass: for the grid's pixels of one block (BLOCK_PIXELS of them,
// up to 100,000 pixels in all) and 16 channels, the correlation of dy with the shifted input,
// dW[c][ky][kx] = sum over pixels q of dy[q][c] g[c][q + (ky - 3, kx - 3)], and the bias's
// sum of dy: partial[block][c][50] (tap 49 the bias); ppeg_backward_weight.comp adds the blocks
// in order. The 5x5 and 3x3 kernels' gradients are the centre of the 7x7's, and the three
// biases' the same sum. The workgroup is 16 neighbouring channels (a lane each, neighbouring
// loads) by 4 slices of the block's pixels: no invocation loops over more than BLOCK_PIXELS / 4
// pixels (llvmpipe ends an invocation's loops after 65,535 iterations: bag_rows.glsl). Every
// loop that indexes `sums` is unrolled with a constant trip count (bounds tested inside), so
// that the 50 sums stay in registers (gemm_block.glsl: an indexed array otherwise lives in
// memory), and the slices meet once, through shared memory (one barrier: lavapipe compiles a
// kernel in pieces between barriers, and a barrier a tap took 18 s to compile).
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x = 64) in;
layout(binding = 0) uniform samplerBuffer dy;  // texels: llvmpipe loads them as vectors
layout(binding = 1) uniform samplerBuffer x;
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer Partial { float partial[]; };
layout(push_constant) uniform Push { uint width, side, accumulate, blocks; } p;
const uint LANES = 16u, SLICES = 4u, GROUP = LANES * SLICES, TAPS = 50u;
const uint BLOCK_PIXELS = 2048u;  // Ppeg::kBlockPixels
shared float slice_sums[TAPS * GROUP];
void main() {
  uint t = gl_LocalInvocationID.x, lane = t % LANES, slice = t / LANES;
  uint c = gl_WorkGroupID.x * LANES + lane;
  uint block = gl_WorkGroupID.y;
  uint side = transmil_grid_side(min(count, p.side * p.side));
  uint first = block * BLOCK_PIXELS, last = min(first + BLOCK_PIXELS, side * side);
  float sums[TAPS];
  [[unroll]] for (uint tap = 0u; tap < TAPS; ++tap) sums[tap] = 0.0;
  if (c < p.width)
    for (uint q = first + slice; q < last; q += SLICES) {
      float gradient = texelFetch(dy, int((1u + q) * p.width + c)).x;
      sums[49] += gradient;
      int pixel_row = int(q / side), pixel_column = int(q % side);
      [[unroll]] for (int ky = 0; ky < 7; ++ky) {
        int source_row = pixel_row + ky - 3;
        if (source_row < 0 || source_row >= int(side)) continue;
        [[unroll]] for (int kx = 0; kx < 7; ++kx) {
          int source_column = pixel_column + kx - 3;
          if (source_column < 0 || source_column >= int(side)) continue;
          uint source = 1u + uint(source_row) * side + uint(source_column);
          sums[ky * 7 + kx] += gradient * texelFetch(x, int(source * p.width + c)).x;
        }
      }
    }
  [[unroll]] for (uint tap = 0u; tap < TAPS; ++tap) slice_sums[tap * GROUP + t] = sums[tap];
  barrier();
  // The slices' sums of each (channel, tap), added in slice order.
  for (uint output_index = t; output_index < TAPS * LANES; output_index += GROUP) {
    uint tap = output_index / LANES, column = gl_WorkGroupID.x * LANES + output_index % LANES;
    float total = 0.0;
    for (uint s = 0u; s < SLICES; ++s) total += slice_sums[tap * GROUP + s * LANES + output_index % LANES];
    if (column < p.width) partial[(block * p.width + column) * TAPS + tap] = total;
  }
}
