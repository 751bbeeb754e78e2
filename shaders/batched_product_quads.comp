#version 450
#extension GL_EXT_control_flow_attributes : require
// batched_product.comp for CPU devices where the operands allow it, with the same push
// constants and outputs (a dynamic dimension ends at the sequence's length from `start`), A and B
// read as texels of four elements. On llvmpipe a one-element texel is a lane of an 8-lane
// gather; a four-element texel is one 16-byte load a lane (gemm_quads.comp says more).
// Each invocation owns the 4 x 4 outputs at rows m0..m0+3 and columns n0..n0+3 of a 32 x 32
// block, and takes 4 reduction steps an iteration: a 4 x 4 tile of A and of B from four texels
// each, along whichever dimension the operand is contiguous in (A_ALONG_K: A's texel holds
// steps k..k+3 of one row, else rows m..m+3 at one step; B_ALONG_K likewise, else columns).
// Offsets, the strides that step between texels and the static M, N and K are multiples of 4
// (nystrom_attention.cpp); reduction steps past a dynamic depth are taken as zeros.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x = 8, local_size_y = 8) in;
layout(constant_id = 0) const bool A_ALONG_K = false;
layout(constant_id = 1) const bool B_ALONG_K = false;
layout(binding = 0) uniform samplerBuffer a_quads;
layout(binding = 1, B4_TEXELS) uniform readonly imageBuffer b_quads;  // of its own type (common.glsl)
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer C { ACT c[]; };
layout(push_constant) uniform Push {
  uint M, N, K, dynamic;  // dynamic: bit 0 M, bit 1 N, bit 2 K
  uint a_offset, a_batch, a_row, a_col;
  uint b_offset, b_batch, b_row, b_col;
  uint c_offset, c_batch, c_row, c_col;
  float alpha, diagonal;
  uint accumulate, start;
} p;

void main() {
  uint whole = transmil_sequence_length(count), sequence = whole > p.start ? whole - p.start : 0u;
  uint rows = (p.dynamic & 1u) != 0u ? min(p.M, sequence) : p.M;
  uint columns = (p.dynamic & 2u) != 0u ? min(p.N, sequence) : p.N;
  uint depth = (p.dynamic & 4u) != 0u ? min(p.K, sequence) : p.K;
  uint batch = gl_WorkGroupID.z;
  uint m0 = gl_WorkGroupID.y * 32u + 4u * gl_LocalInvocationID.y;
  uint n0 = gl_WorkGroupID.x * 32u + 4u * gl_LocalInvocationID.x;
  if (m0 >= p.M || n0 >= p.N) return;  // M and N are multiples of 4: a block is whole or absent
  uint a_base = p.a_offset + batch * p.a_batch + m0 * p.a_row;
  uint b_base = p.b_offset + batch * p.b_batch + n0 * p.b_col;
  vec4 acc[4];  // acc[i][j]: row m0 + i, column n0 + j
  [[unroll]] for (uint i = 0u; i < 4u; ++i) acc[i] = vec4(0.0);
  bool live = m0 < rows && n0 < columns;  // else its outputs are zeros, or left as they are
  for (uint k = 0u; live && k < depth; k += 4u) {
    vec4 a_tile[4], b_tile[4];  // a_tile[s][i] = A(m0 + i, k + s); b_tile[s][j] = B(k + s, n0 + j)
    if (A_ALONG_K) {
      vec4 row[4];  // row[i]: A(m0 + i, k .. k + 3)
      [[unroll]] for (uint i = 0u; i < 4u; ++i) row[i] = texelFetch(a_quads, int((a_base + i * p.a_row + k) / 4u));
      [[unroll]] for (uint s = 0u; s < 4u; ++s) a_tile[s] = vec4(row[0][s], row[1][s], row[2][s], row[3][s]);
    } else {
      [[unroll]] for (uint s = 0u; s < 4u; ++s) a_tile[s] = texelFetch(a_quads, int((a_base + (k + s) * p.a_col) / 4u));
    }
    if (B_ALONG_K) {
      vec4 column[4];  // column[j]: B(k .. k + 3, n0 + j)
      [[unroll]] for (uint j = 0u; j < 4u; ++j) column[j] = imageLoad(b_quads, int((b_base + j * p.b_col + k) / 4u));
      [[unroll]] for (uint s = 0u; s < 4u; ++s) b_tile[s] = vec4(column[0][s], column[1][s], column[2][s], column[3][s]);
    } else {
      [[unroll]] for (uint s = 0u; s < 4u; ++s) b_tile[s] = imageLoad(b_quads, int((b_base + (k + s) * p.b_row) / 4u));
    }
    [[unroll]] for (uint s = 0u; s < 4u; ++s) {
      // Selects, not products: memory past the depth may hold anything, NaN included.
      bool step = k + s < depth;
      vec4 a_step = step ? a_tile[s] : vec4(0.0), b_step = step ? b_tile[s] : vec4(0.0);
      [[unroll]] for (uint i = 0u; i < 4u; ++i) acc[i] += a_step[i] * b_step;
    }
  }
  [[unroll]] for (uint i = 0u; i < 4u; ++i)
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      uint m = m0 + i, n = n0 + j;
      uint at = p.c_offset + batch * p.c_batch + m * p.c_row + n * p.c_col;
      bool inside = m < rows && n < columns;
      float value = inside ? p.alpha * acc[i][j] + (m == n ? p.diagonal : 0.0) : 0.0;
      if (p.accumulate == 0u) {
        c[at] = ACT(value);
      } else if (inside) {
        c[at] = ACT(float(c[at]) + value);
      }
    }
}
