#version 450
// In place, each row of x [batch, rows, length] becomes its softmax, one workgroup a row.
// Dynamic rows or columns (bits 0 and 1) end at the bag's sequence length S: rows past it and
// columns past it become 0. With `padded`, the row also holds the P - S zero scores of the
// sequence's front padding to P, the next multiple of `landmarks` (nystrom_attention.py pads
// the sequence with zero rows, whose keys score 0): they count in the sum, and are not stored.
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SUBGROUP_SUM = false;  // the workgroup is one subgroup: no barriers
#include "reduce.glsl"
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(push_constant) uniform Push {
  uint rows, row_length, dynamic, padded, landmarks;
} p;

shared float maxima[gl_WorkGroupSize.x];

float row_max(float value) {
  if (SUBGROUP_SUM) return subgroupMax(value);
  uint t = gl_LocalInvocationID.x;
  maxima[t] = value;
  barrier();
  for (uint half_size = gl_WorkGroupSize.x / 2u; half_size > 0u; half_size >>= 1) {
    if (t < half_size) maxima[t] = max(maxima[t], maxima[t + half_size]);
    barrier();
  }
  float result = maxima[0];
  barrier();
  return result;
}

void main() {
  uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.rows) return;  // the whole workgroup: its barriers stay in uniform control flow
  uint sequence = transmil_sequence_length(count);
  uint live_rows = (p.dynamic & 1u) != 0u ? min(p.rows, sequence) : p.rows;
  uint live = (p.dynamic & 2u) != 0u ? min(p.row_length, sequence) : p.row_length;
  uint first = (gl_WorkGroupID.z * p.rows + row) * p.row_length, lane = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
  if (row >= live_rows) {
    for (uint i = lane; i < p.row_length; i += step) x[first + i] = 0.0;
    return;
  }
  uint zeros = p.padded != 0u ? (sequence + p.landmarks - 1u) / p.landmarks * p.landmarks - sequence : 0u;
  float largest = zeros > 0u ? 0.0 : -3.402823466e38;
  for (uint i = lane; i < live; i += step) largest = max(largest, x[first + i]);
  largest = row_max(largest);
  float sum = 0.0;
  for (uint i = lane; i < live; i += step) sum += exp(x[first + i] - largest);
  sum = (SUBGROUP_SUM ? subgroupAdd(sum) : workgroup_sum(vec2(sum, 0.0)).x) + float(zeros) * exp(-largest);
  for (uint i = lane; i < p.row_length; i += step) x[first + i] = i < live ? exp(x[first + i] - largest) / sum : 0.0;
}
