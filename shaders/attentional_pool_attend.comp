#version 450
// attentional_pool's weighted sum: out[n, i, h * HD + d] = sum_j softmax_j(s[n, h, i, :]) v[n, j, h, d],
// one invocation per output element, the softmax's maximum and total over the T scores in float
// (recomputed by each of the head's HD invocations: T reads each, against HD x T for the sum).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer scores;
layout(binding = 1) uniform samplerBuffer kv;
layout(std430, binding = 2) writeonly buffer Attended { float attended[]; };
layout(push_constant) uniform Push {
  uint count;  // N * Q * H * HD
  uint tokens, queries, heads, head_dim;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint width = p.heads * p.head_dim, column = i % width, h = column / p.head_dim;
  uint query = (i / width) % p.queries, n = i / (width * p.queries);
  uint first = ((n * p.heads + h) * p.queries + query) * p.tokens;
  float largest = -3.402823e38;  // finite: no inf - inf
  for (uint j = 0u; j < p.tokens; ++j) largest = max(largest, texelFetch(scores, int(first + j)).x);
  float total = 0.0, sum = 0.0;
  uint value = n * p.tokens * 2u * width + width + column;  // v of token 0, this element
  for (uint j = 0u; j < p.tokens; ++j) {
    float weight = exp(texelFetch(scores, int(first + j)).x - largest);
    total += weight;
    sum = fma(weight, texelFetch(kv, int(value + j * 2u * width)).x, sum);
  }
  attended[i] = sum / total;
}
