#version 450
// Swin's (shifted) window attention, timm 0.5.4's SwinTransformerBlock and WindowAttention, one
// invocation per (image, token, head) with the tokens in raster order: the token at (r, c) sits
// at (r - shift, c - shift) mod (H, W) of the rolled grid, in the window of that position; its
// keys are the window's tokens, each at (r' + shift, c' + shift) mod (H, W) of the input. Score:
// scale * q . k + table[(qy - ky + w - 1) * (2w - 1) + qx - kx + w - 1, head], plus -100 where the
// rolled grid's regions of query and key differ (timm's attn_mask: per axis, region 0 below
// size - w, 1 below size - shift, else 2), when shift > 0. The softmax runs online in float
// (running maximum, sum and unnormalised output); nothing but the output is stored.
// qkv [N, H * W, 3, heads, HD] (timm's qkv(x).reshape(B, N, 3, heads, C // heads)); out [N, H * W, heads * HD].
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int HD = 32;  // head dimension
layout(binding = 0) uniform samplerBuffer qkv;
layout(binding = 1, r32f) uniform readonly imageBuffer table;  // [(2w - 1)^2, heads], float
layout(std430, binding = 2) writeonly buffer Out { ACT attended[]; };
layout(push_constant) uniform Push {
  uint count;  // N * H * W * heads
  uint heads, window, shift, grid_height, grid_width;
  float scale;
} p;

uint region(uint shifted, uint size) {
  return shifted < size - p.window ? 0u : (shifted < size - p.shift ? 1u : 2u);
}

void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint head = i % p.heads, token = i / p.heads;
  uint tokens = p.grid_height * p.grid_width;
  uint n = token / tokens, position = token % tokens;
  uint r = position / p.grid_width, c = position % p.grid_width;
  uint sr = (r + p.grid_height - p.shift) % p.grid_height, sc = (c + p.grid_width - p.shift) % p.grid_width;
  uint qy = sr % p.window, qx = sc % p.window, top = sr - qy, left = sc - qx;
  uint width = p.heads * uint(HD), row = 3u * width, span = 2u * p.window - 1u;
  uint query_region = p.shift > 0u ? region(sr, p.grid_height) * 3u + region(sc, p.grid_width) : 0u;

  float q[HD], out_sum[HD];
  uint q_first = (n * tokens + position) * row + head * uint(HD);
  for (int d = 0; d < HD; ++d) {
    q[d] = texelFetch(qkv, int(q_first + uint(d))).x;
    out_sum[d] = 0.0;
  }
  float largest = -3.0e38, total = 0.0;  // below any score: the first key rescales nothing
  for (uint ky = 0u; ky < p.window; ++ky) {
    uint key_r = (top + ky + p.shift) % p.grid_height;
    for (uint kx = 0u; kx < p.window; ++kx) {
      uint key_c = (left + kx + p.shift) % p.grid_width;
      uint k_first = (n * tokens + key_r * p.grid_width + key_c) * row + width + head * uint(HD);
      float dot_product = 0.0;
      for (int d = 0; d < HD; ++d) dot_product = fma(q[d], texelFetch(qkv, int(k_first + uint(d))).x, dot_product);
      uint bias_row = (qy + p.window - 1u - ky) * span + (qx + p.window - 1u - kx);
      float score = dot_product * p.scale + imageLoad(table, int(bias_row * p.heads + head)).x;
      if (p.shift > 0u && region(top + ky, p.grid_height) * 3u + region(left + kx, p.grid_width) != query_region)
        score -= 100.0;
      float raised = max(largest, score), rescale = exp(largest - raised), weight = exp(score - raised);
      largest = raised;
      total = total * rescale + weight;
      uint v_first = k_first + width;
      for (int d = 0; d < HD; ++d) out_sum[d] = fma(weight, texelFetch(qkv, int(v_first + uint(d))).x, out_sum[d] * rescale);
    }
  }
  uint out_first = (n * tokens + position) * width + head * uint(HD);
  for (int d = 0; d < HD; ++d) attended[out_first + uint(d)] = ACT(out_sum[d] / total);
}
