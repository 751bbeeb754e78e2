#version 450
// The landmarks of Nystrom attention (nystrom_attention.py): the sequence of S rows, padded at
// the front with zero rows to P (the next multiple of the landmark count m), falls into m runs
// of l = P / m rows; each landmark is its run's mean. q_landmarks[h, a, c] = scale * mean of
// q, k_landmarks of k, over head h's columns c of the projections q and k [S_max, D]. One
// invocation per (head, landmark, column).
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer queries;
layout(binding = 1) uniform samplerBuffer keys;
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) writeonly buffer QueryLandmarks { float q_landmarks[]; };
layout(std430, binding = 4) writeonly buffer KeyLandmarks { float k_landmarks[]; };
layout(push_constant) uniform Push {
  uint heads, head_dim, landmarks, width;
  float scale;
} p;

void main() {
  uint index = global_index();
  if (index >= p.heads * p.landmarks * p.head_dim) return;
  uint c = index % p.head_dim, landmark = index / p.head_dim % p.landmarks, head = index / (p.head_dim * p.landmarks);
  uint sequence = transmil_sequence_length(count);
  uint run = (sequence + p.landmarks - 1u) / p.landmarks, padding = run * p.landmarks - sequence;
  // Real rows j sit at padded positions j + padding: this run's are [landmark * run - padding, +run).
  uint first = max(landmark * run, padding) - padding, last = min((landmark + 1u) * run - padding, sequence);
  if ((landmark + 1u) * run <= padding) last = first;  // a run of padding alone
  uint column = head * p.head_dim + c;
  float q = 0.0, k = 0.0;
  for (uint j = first; j < last; ++j) {
    q += texelFetch(queries, int(j * p.width + column)).x;
    k += texelFetch(keys, int(j * p.width + column)).x;
  }
  q_landmarks[index] = q * p.scale / float(run);
  k_landmarks[index] = k / float(run);
}
