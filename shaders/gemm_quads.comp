#version 450
// gemm.comp for CPU devices where the operands allow it: C(m,n) (+)= sum_k A(m,k) B(k,n)
// (+ bias[m], then the epilogue: epilogue.glsl), A and B read as texels of four floats. On llvmpipe a float texel is one lane of
// an 8-lane gather (vpgatherdd, two thirds of gemm.comp's time at 1024^3), a four-float texel
// one 16-byte load a lane. A is contiguous along m (a texel holds rows m..m+3 at one k) or, with
// A_ALONG_K, along k (reduction steps k..k+3 of one row); B is contiguous along k.
//
// The workgroup is one subgroup. Each lane owns TM rows ("slots"): along m, slot 4f+c is row
// m0 + 4*LANES*f + 4*lane + c (component c of the lane's texel f); along k, slot s is row
// m0 + LANES*s + lane. The lanes share TN columns: lane l loads B's texel of column n0 + l % TN
// at the l / TN-th block of 4 reduction steps, and every lane takes each B(k, n) from it by a
// shuffle, so an FMA of TM x TN per step costs TM / 4 (along m) or TM / 4 per step (along k)
// texel loads and TN shuffles. Accumulators, loaded texels and shuffled values are indexed only
// in unrolled loops, so that they stay in registers (gemm_block.glsl says why).
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TM = 4;  // a multiple of 4
layout(constant_id = 2) const int TN = 6;  // at most the subgroup's lanes
layout(constant_id = 3) const bool HAS_BIAS = false;
layout(constant_id = 4) const bool A_ALONG_K = false;
layout(binding = 0) uniform samplerBuffer a_quads;
layout(binding = 1, B4_TEXELS) uniform readonly imageBuffer b_quads;
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };  // unread without HAS_BIAS
layout(std430, binding = 3) buffer C { ACT c[]; };
// As gemm.comp's, in elements; a_m (along k) or a_k (along m) and b_n are multiples of 4, and
// the other stride of each operand is 1.
layout(push_constant) uniform Push {
  uint M, N, K;
  uint a_m, a_k, b_k, b_n, c_m, c_n;
  uint accumulate;
} p;
#define EPILOGUE_CONSTANT 6
#define EPILOGUE_BINDING 4
#include "epilogue.glsl"

const int LANES = int(gl_WorkGroupSize.x);
const int SPAN = LANES / TN;  // blocks of 4 reduction steps that one B texel load covers
// Reduction steps a block loads before its FMAs: 8, or what one B texel covers where more.
layout(constant_id = 5) const int BLOCK_STEPS = 16;  // steps loaded ahead of their FMAs
const int STEPS = 4 * SPAN > BLOCK_STEPS ? 4 * SPAN : BLOCK_STEPS;
const int B_LOADS = STEPS / (4 * SPAN);
const int A_TEXELS = A_ALONG_K ? TM : TM / 4;

float acc[TM][TN];
int a_texel[A_TEXELS];  // at k = 0
int b_column;           // the first B texel of this lane's column
uint b_block;           // which block of 4 steps the lane loads, of the SPAN that a load covers

// Reduction steps [k0, k0 + STEPS); `guarded`: only those below K (the last, partial block).
// Every texel of the block is loaded before its first FMA: on llvmpipe a texel load is a call,
// around which every live accumulator is stored and reloaded, so the loads come in one run
// and the FMAs after it keep the accumulators in registers.
void multiply_steps(uint k0, bool guarded) {
  vec4 b_loaded[B_LOADS];
  [[unroll]] for (int q = 0; q < B_LOADS; ++q) {
    // Past K (the partial block), the lane loads the last block instead: its values go unused.
    uint block = k0 / 4u + q * SPAN + b_block;
    if (guarded) block = min(block, p.K / 4u - 1u);
    b_loaded[q] = imageLoad(b_quads, b_column + int(block));
  }
  vec4 a_loaded[STEPS / 4][TM];  // along m: [u / 4][4 * f + u % 4] holds texel f of step u
  [[unroll]] for (int g = 0; g < STEPS / 4; ++g) {
    uint k = k0 + 4 * g;
    if (!guarded || k < p.K) {
      if (A_ALONG_K) {
        [[unroll]] for (int s = 0; s < TM; ++s) a_loaded[g][s] = texelFetch(a_quads, a_texel[s] + int(k / 4u));
      } else {
        [[unroll]] for (int f = 0; f < TM / 4; ++f)
          [[unroll]] for (int u = 0; u < 4; ++u)
            a_loaded[g][4 * f + u] = texelFetch(a_quads, a_texel[f] + int((k + u) * (p.a_k / 4u)));
      }
    }
  }
  [[unroll]] for (int u = 0; u < STEPS; ++u) {
    if (!guarded || k0 + u < p.K) {
      float a[TM];
      [[unroll]] for (int s = 0; s < TM; ++s)
        a[s] = A_ALONG_K ? a_loaded[u / 4][s][u % 4] : a_loaded[u / 4][4 * (s / 4) + u % 4][s % 4];
      float b[TN];
      int q = u / (4 * SPAN), lane_block = (u / 4) % SPAN;
      [[unroll]] for (int j = 0; j < TN; ++j) b[j] = subgroupShuffle(b_loaded[q][u % 4], lane_block * TN + j);
      [[unroll]] for (int s = 0; s < TM; ++s)
        [[unroll]] for (int j = 0; j < TN; ++j) acc[s][j] = fma(a[s], b[j], acc[s][j]);
    }
  }
}

uint slot_row(uint m0, int s) {
  uint lane = gl_SubgroupInvocationID;
  return A_ALONG_K ? m0 + LANES * s + lane : m0 + 4 * LANES * (s / 4) + 4 * lane + s % 4;
}

void main() {
  uint lane = gl_SubgroupInvocationID;
  uint n0 = gl_WorkGroupID.x * TN, m0 = gl_WorkGroupID.y * TM * LANES;
  // Rows and columns past the matrix read its last ones (their results are not stored).
  [[unroll]] for (int t = 0; t < A_TEXELS; ++t) {
    if (A_ALONG_K) {
      a_texel[t] = int(min(slot_row(m0, t), p.M - 1u) * (p.a_m / 4u));
    } else {
      uint first = min(slot_row(m0, 4 * t), (p.M - 1u) & ~3u);
      a_texel[t] = int(first / 4u);
    }
  }
  uint column = min(n0 + lane % TN, p.N - 1u);
  b_column = int(column * (p.b_n / 4u));
  b_block = min(lane / TN, uint(SPAN - 1));
  [[unroll]] for (int s = 0; s < TM; ++s)
    [[unroll]] for (int j = 0; j < TN; ++j) acc[s][j] = 0.0;
  uint k0 = 0;
  for (; k0 + STEPS <= p.K; k0 += STEPS) multiply_steps(k0, false);
  if (k0 < p.K) multiply_steps(k0, true);
  [[unroll]] for (int s = 0; s < TM; ++s) {
    uint m = slot_row(m0, s);
    float shift = HAS_BIAS ? bias[min(m, p.M - 1u)] : 0.0;
    [[unroll]] for (int j = 0; j < TN; ++j) {
      uint n = n0 + j, at = m * p.c_m + n * p.c_n;
      if (m < p.M && n < p.N) {
        float value = epilogue(acc[s][j] + shift, m, at);
        c[at] = ACT(p.accumulate != 0u ? float(c[at]) + value : value);
      }
    }
  }
}
