#version 450
// blocked[kb, o, u] = weight[o, kb * BLOCK + u] for weight [O, K = C*KH*KW] (zero past K):
// the layout in which conv2d_forward reads its weight; with BLOCK 1, the transpose [K, O] that
// an inference linear layer reads (compute/ops/gemm.h's record_blocked_weight). Its
// neighbouring invocations take neighbouring output channels o: in [O, K] they would load
// floats K apart, all in one cache set where K is a power of two; blocked, they load floats
// BLOCK apart, and each cache line serves BLOCK steps of k. FOLD: each row scaled by
// gamma[o] / sqrt(var[o] + eps), a batch norm folded into the convolution (conv2d_forward.comp
// adds its shift).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BLOCK = 16;  // Conv2d's kWeightBlock
layout(constant_id = 2) const bool FOLD = false;
layout(binding = 0) uniform samplerBuffer weight;
layout(std430, binding = 1) writeonly buffer Blocked { ACT blocked[]; };  // float, or fp16 weights' type
layout(std430, binding = 2) readonly buffer Gamma { float gamma[]; };     // unread without FOLD
layout(std430, binding = 3) readonly buffer Var { float running_var[]; };  // unread without FOLD
layout(push_constant) uniform Push { uint rows, columns, count; float eps; } p;  // O, K, O * ceil(K / BLOCK) * BLOCK
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint u = i % BLOCK, o = i / BLOCK % p.rows, k = i / (BLOCK * p.rows) * BLOCK + u;
  float scale = FOLD ? gamma[o] * inversesqrt(running_var[o] + p.eps) : 1.0;
  blocked[i] = ACT(k < p.columns ? texelFetch(weight, int(o * p.columns + k)).x * scale : 0.0);
}
