#version 450
#extension GL_EXT_control_flow_attributes : require
// C[b](m, n) = alpha sum_k A[b](m, k) B[b](k, n) + diagonal [m == n] (+ C[b](m, n) with
// accumulate), for each batch b of a workgroup z: the per-head products of Nystrom attention.
// Element (b, r, c) of an operand is at offset + b * batch + r * row + c * col, so one kernel
// serves every transposition and every head's columns of a packed projection. A dimension
// flagged in `dynamic` is the bag's sequence length at most (transmil_grid.glsl, from the
// count on the device), less `start` where the operands are a chunk of the sequence from its
// row `start` on: rows and columns past it are written 0, and the reduction stops there.
// Each invocation owns 4 x 4 outputs of a 32 x 32 block; the reduction takes 4 steps an
// iteration, so that a sequence of 100,000 rows stays within lavapipe's 65,535 loop iterations.
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x = 8, local_size_y = 8) in;
layout(binding = 0) uniform samplerBuffer a;
layout(binding = 1, B_TEXELS) uniform readonly imageBuffer b;  // of its own type (common.glsl)
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

const uint BLOCK = 4u;

void main() {
  uint whole = transmil_sequence_length(count), sequence = whole > p.start ? whole - p.start : 0u;
  uint rows = (p.dynamic & 1u) != 0u ? min(p.M, sequence) : p.M;
  uint columns = (p.dynamic & 2u) != 0u ? min(p.N, sequence) : p.N;
  uint depth = (p.dynamic & 4u) != 0u ? min(p.K, sequence) : p.K;
  uint batch = gl_WorkGroupID.z;
  uint m0 = gl_WorkGroupID.y * 8u * BLOCK + gl_LocalInvocationID.y;
  uint n0 = gl_WorkGroupID.x * 8u * BLOCK + gl_LocalInvocationID.x;
  uint a_rows[BLOCK], b_columns[BLOCK];
  [[unroll]] for (uint i = 0u; i < BLOCK; ++i) {
    a_rows[i] = p.a_offset + batch * p.a_batch + min(m0 + 8u * i, rows - 1u) * p.a_row;
    b_columns[i] = p.b_offset + batch * p.b_batch + min(n0 + 8u * i, columns - 1u) * p.b_col;
  }
  float acc[BLOCK][BLOCK];
  [[unroll]] for (uint i = 0u; i < BLOCK; ++i)
    [[unroll]] for (uint j = 0u; j < BLOCK; ++j) acc[i][j] = 0.0;
  if (rows > 0u && columns > 0u) {
    for (uint k0 = 0u; k0 < depth; k0 += 4u) {
      [[unroll]] for (uint step = 0u; step < 4u; ++step) {
        uint k = k0 + step;
        if (k < depth) {
          float a_values[BLOCK], b_values[BLOCK];
          [[unroll]] for (uint i = 0u; i < BLOCK; ++i) {
            a_values[i] = texelFetch(a, int(a_rows[i] + k * p.a_col)).x;
            b_values[i] = imageLoad(b, int(k * p.b_row + b_columns[i])).x;
          }
          [[unroll]] for (uint i = 0u; i < BLOCK; ++i)
            [[unroll]] for (uint j = 0u; j < BLOCK; ++j) acc[i][j] += a_values[i] * b_values[j];
        }
      }
    }
  }
  [[unroll]] for (uint i = 0u; i < BLOCK; ++i) {
    uint m = m0 + 8u * i;
    [[unroll]] for (uint j = 0u; j < BLOCK; ++j) {
      uint n = n0 + 8u * j;
      if (m >= p.M || n >= p.N) continue;
      uint at = p.c_offset + batch * p.c_batch + m * p.c_row + n * p.c_col;
      bool inside = m < rows && n < columns;
      float value = inside ? p.alpha * acc[i][j] + (m == n ? p.diagonal : 0.0) : 0.0;
      if (p.accumulate != 0u) {
        if (inside) c[at] = ACT(float(c[at]) + value);
      } else {
        c[at] = ACT(value);
      }
    }
  }
}
