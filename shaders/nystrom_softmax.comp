#version 450
// In place, each row of x [batch, rows, length] becomes its softmax, one workgroup a row. With
// `dynamic_rows`, the rows are a chunk of the sequence from its row `start` on, and those past
// the bag's sequence length S (transmil_grid.glsl) become 0.
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "transmil_grid.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SUBGROUP_SUM = false;  // the workgroup is one subgroup: no barriers
#include "reduce.glsl"
#include "row_max.glsl"
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Count { uint count; };
layout(push_constant) uniform Push {
  uint rows, row_length, dynamic_rows, start;
} p;

void main() {
  uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.rows) return;  // the whole workgroup: its barriers stay in uniform control flow
  uint first = (gl_WorkGroupID.z * p.rows + row) * p.row_length, lane = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
  if (p.dynamic_rows != 0u && p.start + row >= transmil_sequence_length(count)) {
    for (uint i = lane; i < p.row_length; i += step) x[first + i] = 0.0;
    return;
  }
  float largest = -3.402823466e38;
  for (uint i = lane; i < p.row_length; i += step) largest = max(largest, x[first + i]);
  largest = row_max(largest);
  float sum = 0.0;
  for (uint i = lane; i < p.row_length; i += step) sum += exp(x[first + i] - largest);
  sum = SUBGROUP_SUM ? subgroupAdd(sum) : workgroup_sum(vec2(sum, 0.0)).x;
  for (uint i = lane; i < p.row_length; i += step) x[first + i] = exp(x[first + i] - largest) / sum;
}
