#version 450
// The landmarks' share of the projections' gradients (nystrom_landmarks.comp backward): each of
// the S rows j adds its run's landmark gradient over the run length l, the queries' scaled:
// dq[j, h*d + c] += scale / l * dq_landmarks[h, a(j), c], dk[j, h*d + c] += dk_landmarks[h, a(j), c] / l.
// One invocation per (row, query or key column).
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer QueryLandmarks { float dq_landmarks[]; };
layout(std430, binding = 1) readonly buffer KeyLandmarks { float dk_landmarks[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(std430, binding = 3) buffer Dq { ACT dq[]; };
layout(std430, binding = 4) buffer Dk { ACT dk[]; };
layout(push_constant) uniform Push {
  uint rows, heads, head_dim, landmarks, width;
  float scale;
} p;

void main() {
  uint index = global_index();
  uint twice = 2u * p.width;
  if (index >= p.rows * twice) return;
  uint j = index / twice, column = index % twice;
  uint sequence = transmil_sequence_length(count);
  if (j >= sequence) return;
  uint run = (sequence + p.landmarks - 1u) / p.landmarks, padding = run * p.landmarks - sequence;
  uint landmark = (j + padding) / run;
  bool key = column >= p.width;
  uint within = column % p.width, head = within / p.head_dim, c = within % p.head_dim;
  uint at = (head * p.landmarks + landmark) * p.head_dim + c;
  float share = key ? dk_landmarks[at] / float(run) : dq_landmarks[at] * p.scale / float(run);
  uint slot = j * p.width + within;
  if (key)
    dk[slot] = ACT(float(dk[slot]) + share);
  else
    dq[slot] = ACT(float(dq[slot]) + share);
}
