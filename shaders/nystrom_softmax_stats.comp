#version 450
// The softmax over the whole sequence of each row of ql k^T [batch, rows, S] (nystrom_attention's
// third), taken a chunk of columns at a time so that no [batch, rows, S] tensor is stored:
// x [batch, rows, length] holds the scores of the sequence's columns start .. start + length,
// stats [batch, rows, 2] each row's running maximum and sum of exponentials, one workgroup a
// row. Mode 0 (the first chunk) starts them, 1 folds a chunk in, 2 turns a chunk into the
// softmax's values in place once every chunk is in. Columns past the bag's sequence length S
// (transmil_grid.glsl) count for nothing and become 0. The row also holds the P - S zero scores
// of the sequence's front padding to P, the next multiple of `landmarks` (nystrom_attention.py
// pads the sequence with zero rows, whose keys score 0): they count in the sum, and are not stored.
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SUBGROUP_SUM = false;  // the workgroup is one subgroup: no barriers
#include "reduce.glsl"
#include "row_max.glsl"
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) buffer Stats { vec2 stats[]; };
layout(std430, binding = 2) readonly buffer Count { uint count; };
layout(push_constant) uniform Push {
  uint rows, row_length, start, landmarks, mode;
} p;

const uint START = 0u, FOLD = 1u, APPLY = 2u;

void main() {
  uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.rows) return;  // the whole workgroup: its barriers stay in uniform control flow
  uint at = gl_WorkGroupID.z * p.rows + row, first = at * p.row_length;
  uint lane = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
  uint sequence = transmil_sequence_length(count);
  uint live = sequence > p.start ? min(p.row_length, sequence - p.start) : 0u;
  if (p.mode == APPLY) {
    vec2 row_stats = stats[at];
    for (uint i = lane; i < p.row_length; i += step)
      x[first + i] = i < live ? exp(x[first + i] - row_stats.x) / row_stats.y : 0.0;
    return;
  }
  float largest = -3.402823466e38;
  for (uint i = lane; i < live; i += step) largest = max(largest, x[first + i]);
  largest = row_max(largest);
  vec2 before = vec2(-3.402823466e38, 0.0);  // (maximum, sum) so far
  if (p.mode == START) {
    uint zeros = (sequence + p.landmarks - 1u) / p.landmarks * p.landmarks - sequence;
    if (zeros > 0u) before = vec2(0.0, float(zeros));
  } else {
    before = stats[at];
  }
  float maximum = max(before.x, largest);
  float sum = 0.0;
  for (uint i = lane; i < live; i += step) sum += exp(x[first + i] - maximum);
  sum = SUBGROUP_SUM ? subgroupAdd(sum) : workgroup_sum(vec2(sum, 0.0)).x;
  barrier();  // every invocation has read the stats before the first writes them
  if (lane == 0u) stats[at] = vec2(maximum, sum + before.y * exp(before.x - maximum));
}
