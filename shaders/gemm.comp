#version 450
// C(m,n) (+)= sum_k A(m,k) B(k,n) (+ bias[m]), each operand addressed through two strides so
// that one kernel serves every transposition (dense forward, both backward passes, benchmarks).
// Then the epilogue fused in (epilogue.glsl; not with accumulate).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TM = 4;
layout(constant_id = 2) const int TN = 16;
layout(constant_id = 3) const bool HAS_BIAS = false;
layout(constant_id = 4) const bool SHARE_B = false;
layout(constant_id = 5) const int K_UNROLL = 1;
layout(constant_id = 6) const bool SHARE_K = false;
// Workgroups x count column blocks and y row blocks (else x rows, y and z columns): lavapipe
// runs workgroups x first, so neighbouring workgroups then share their A rows (a weight's
// panel, kept in cache) and sweep the smaller B.
layout(constant_id = 7) const bool COLUMNS_FIRST = false;
layout(binding = 0) uniform samplerBuffer a_texels;
layout(binding = 1, B_TEXELS) uniform readonly imageBuffer b_texels;
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };  // unread without HAS_BIAS
layout(std430, binding = 3) buffer C { ACT c[]; };  // an activation, or in the fp32 variant also a parameter gradient
layout(push_constant) uniform Push {
  uint M, N, K;
  uint a_m, a_k, b_k, b_n, c_m, c_n;
  uint accumulate;
} p;
#define EPILOGUE_CONSTANT 8
#define EPILOGUE_BINDING 4
#include "epilogue.glsl"

#include "gemm_block.glsl"

uint b_columns[B_LOADS];

void seek_reduction(uint k) {}
void step_reduction() {}
float a_value(uint m, uint k) { return texelFetch(a_texels, int(m * p.a_m + k * p.a_k)).x; }
void b_values(uint k, out float v[B_LOADS]) {
  for (int q = 0; q < B_LOADS; ++q) v[q] = imageLoad(b_texels, int(k * p.b_k + b_columns[q])).x;
}

void main() {
  uint m0 = (COLUMNS_FIRST ? gl_WorkGroupID.y : gl_WorkGroupID.x) * gl_WorkGroupSize.x * TM + gl_LocalInvocationID.x;
  uint n0 = COLUMNS_FIRST ? gl_WorkGroupID.x * TN : block_first_column();
  for (int q = 0; q < B_LOADS; ++q) b_columns[q] = min(loaded_column(n0, q), p.N - 1) * p.b_n;
  accumulate_block(m0, p.M, 0, p.K);
  for (int i = 0; i < TM; ++i) {
    uint m = m0 + i * gl_WorkGroupSize.x;
    float shift = HAS_BIAS ? bias[min(m, p.M - 1)] : 0.0;
    for (int j = 0; j < TN; ++j) {
      uint at = m * p.c_m + (n0 + j) * p.c_n;
      if (m < p.M && n0 + j < p.N) {
        float value = epilogue(acc[i][j] + shift, m, at);
        c[at] = ACT(p.accumulate != 0u ? float(c[at]) + value : value);
      }
    }
  }
}
