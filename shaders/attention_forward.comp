#version 450
// Multi-head self-attention in one pass (flash attention's tiling): out = softmax(q k^T * scale) v
// per image and head, the T x T scores never stored. qkv [N, T, 3, H, HD] as the packed projection
// of timm (and torchvision's in_proj) writes it; out [N, T, H * HD], heads side by side (timm's
// transpose(1, 2).reshape).
//
// Keys come in tiles of TN. For each tile, the scores of an invocation's TM queries (rows
// m0, m0 + WG, ..., neighbouring invocations taking neighbouring queries) against the tile's keys
// are the register block of shaders/gemm_block.glsl, A = q and B = k^T, with its shapes and
// its shuffles (gemm_tiles); each query then keeps a running maximum, the running sum of
// exp(s - max) and its unnormalised output, all in float, rescaled whenever a tile raises the
// maximum (the online softmax), and adds the tile's exp(s - max) times its values, loaded as B
// rows are. Every tile's work stays in the invocation's registers and needs no barrier (Mesa
// 22.3's lavapipe loses results of long loops around barriers with this much state per invocation).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TM = 4;
layout(constant_id = 2) const int TN = 16;
layout(constant_id = 3) const bool SHARE_B = false;
layout(constant_id = 4) const int K_UNROLL = 1;
layout(constant_id = 5) const int HD = 64;  // head dimension
const bool SHARE_K = false;
layout(binding = 0) uniform samplerBuffer qkv;
layout(std430, binding = 1) writeonly buffer Out { ACT attended[]; };
layout(push_constant) uniform Push {
  uint tokens, heads;
  float scale;
} p;

#include "gemm_block.glsl"

uint base, width, row;    // q of token t at base + t * row; its k at + width, its v at + 2 * width
uint key_rows[B_LOADS];  // the rows of the keys this invocation loads in the current tile

void seek_reduction(uint k) {}
void step_reduction() {}
float a_value(uint m, uint k) { return texelFetch(qkv, int(base + m * row + k)).x; }
void b_values(uint k, out float v[B_LOADS]) {
  for (int q = 0; q < B_LOADS; ++q) v[q] = texelFetch(qkv, int(key_rows[q] + width + k)).x;
}

void main() {
  uint n = gl_WorkGroupID.z, h = gl_WorkGroupID.y;
  width = p.heads * uint(HD);
  row = 3u * width;
  base = n * p.tokens * row + h * uint(HD);
  uint m0 = gl_WorkGroupID.x * gl_WorkGroupSize.x * TM + gl_LocalInvocationID.x;

  float o[TM][HD], largest[TM], total[TM], rescale[TM];
  for (int i = 0; i < TM; ++i) {
    for (int d = 0; d < HD; ++d) o[i][d] = 0.0;
    largest[i] = -3.402823e38;  // finite: no inf - inf
    total[i] = 0.0;
  }
  for (uint n0 = 0u; n0 < p.tokens; n0 += uint(TN)) {
    for (int q = 0; q < B_LOADS; ++q) key_rows[q] = base + min(loaded_column(n0, q), p.tokens - 1u) * row;
    accumulate_block(m0, p.tokens, 0u, uint(HD));  // acc[i][j]: query i's dot product with key n0 + j
    // The online softmax: acc becomes exp(s - new maximum), 0 past the last key.
    for (int i = 0; i < TM; ++i) {
      float tile_largest = largest[i];
      for (int j = 0; j < TN; ++j) {
        acc[i][j] *= p.scale;
        if (n0 + uint(j) < p.tokens) tile_largest = max(tile_largest, acc[i][j]);
      }
      rescale[i] = exp(largest[i] - tile_largest);
      largest[i] = tile_largest;
      total[i] *= rescale[i];
      for (int j = 0; j < TN; ++j) {
        acc[i][j] = n0 + uint(j) < p.tokens ? exp(acc[i][j] - tile_largest) : 0.0;
        total[i] += acc[i][j];
      }
    }
    // o = o * rescale + sum_j acc[i][j] v[n0 + j]: v rows loaded and shared as B rows are.
    for (int d = 0; d < HD; ++d) {
      float loaded[B_LOADS], v[TN];
      for (int q = 0; q < B_LOADS; ++q) loaded[q] = texelFetch(qkv, int(key_rows[q] + 2u * width + uint(d))).x;
      for (int j = 0; j < TN; ++j)
        v[j] = SHARE_B ? subgroupShuffle(loaded[j / gl_WorkGroupSize.x], j % gl_WorkGroupSize.x) : loaded[j];
      for (int i = 0; i < TM; ++i) {
        float sum = o[i][d] * rescale[i];
        for (int j = 0; j < TN; ++j) sum = fma(acc[i][j], v[j], sum);
        o[i][d] = sum;
      }
    }
  }
  for (int i = 0; i < TM; ++i) {
    uint m = m0 + uint(i) * gl_WorkGroupSize.x;
    if (m >= p.tokens) continue;
    uint first = (n * p.tokens + m) * width + h * uint(HD);
    for (int d = 0; d < HD; ++d) attended[first + uint(d)] = ACT(o[i][d] / total[i]);
  }
}
