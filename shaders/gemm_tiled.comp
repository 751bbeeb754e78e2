#version 450
// gemm.comp for GPUs: C(m,n) (+)= sum_k A(m,k) B(k,n) (+ bias[m]), each operand addressed
// through two strides, in shared-memory tiles (gemm_tiled.glsl). A_K_FAST, B_N_FAST: the
// operands' contiguous index (invocations load along it). Then the epilogue fused in
// (epilogue.glsl; not with accumulate).
#include "common.glsl"
layout(constant_id = 6) const bool A_K_FAST = true;
layout(constant_id = 7) const bool B_N_FAST = true;
layout(constant_id = 8) const bool HAS_BIAS = false;
layout(binding = 0) uniform samplerBuffer a_texels;
layout(binding = 1) uniform samplerBuffer b_texels;
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };  // unread without HAS_BIAS
layout(std430, binding = 3) buffer C { ACT c[]; };
layout(push_constant) uniform Push {
  uint M, N, K;
  uint a_m, a_k, b_k, b_n, c_m, c_n;
  uint accumulate;
} p;
#define EPILOGUE_CONSTANT 9
#define EPILOGUE_BINDING 4
#include "epilogue.glsl"

#include "gemm_tiled.glsl"

uint a_row[A_LOADS], b_column[B_LOADS];
void a_slot(int s, uint m) { a_row[s] = m * p.a_m; }
float a_value(int s, uint k) { return texelFetch(a_texels, int(a_row[s] + k * p.a_k)).x; }
void b_slot(int s, uint n) { b_column[s] = n * p.b_n; }
float b_value(int s, uint k) { return texelFetch(b_texels, int(k * p.b_k + b_column[s])).x; }

void main() {
  uint m0 = gl_WorkGroupID.x * BM, n0 = tiled_first_column();
  multiply_block(m0, n0, p.M, p.N, 0, p.K);
  for (int i = 0; i < TM; ++i) {
    uint m = m0 + tile_row(i);
    float shift = HAS_BIAS ? bias[min(m, p.M - 1)] : 0.0;
    for (int j = 0; j < TN; ++j) {
      uint n = n0 + tile_column(j), at = m * p.c_m + n * p.c_n;
      if (m < p.M && n < p.N) {
        float value = epilogue(acc[i][j] + shift, m, at);
        c[at] = ACT(p.accumulate != 0u ? float(c[at]) + value : value);
      }
    }
  }
}
