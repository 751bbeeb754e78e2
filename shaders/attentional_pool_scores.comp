#version 450
// attentional_pool's scores: s[n, h, i, j] = scale * q[i, h] . k[n, j, h], each learned query's head
// against every token's key, one invocation per score (a query or two against some hundred
// tokens: no tile to share). q [Q, H * HD] (projected), kv [N, T, 2 * H * HD] (keys, then values,
// as CONCH v1.5's to_kv(x).chunk(2)), both float.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer q;
layout(binding = 1) uniform samplerBuffer kv;
layout(std430, binding = 2) writeonly buffer Scores { float scores[]; };
layout(push_constant) uniform Push {
  uint count;  // N * H * Q * T
  uint tokens, queries, heads, head_dim;
  float scale;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint j = i % p.tokens, query = (i / p.tokens) % p.queries, h = (i / (p.tokens * p.queries)) % p.heads;
  uint n = i / (p.tokens * p.queries * p.heads), width = p.heads * p.head_dim;
  uint q_first = query * width + h * p.head_dim, k_first = (n * p.tokens + j) * 2u * width + h * p.head_dim;
  float dot_product = 0.0;
  for (uint d = 0u; d < p.head_dim; ++d)
    dot_product = fma(texelFetch(q, int(q_first + d)).x, texelFetch(kv, int(k_first + d)).x, dot_product);
  scores[i] = dot_product * p.scale;
}
