#version 450
// In place, g [batch, rows, length] becomes the gradient of the scores under a row softmax a
// of the same shape: g (a row's) -> a * (g - sum_j a_j g_j), one workgroup a row. Entries that
// nystrom_softmax wrote 0 (past the sequence) stay 0; the padding's zero scores lead to
// constant keys, so their gradients are not needed.
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SUBGROUP_SUM = false;  // the workgroup is one subgroup: no barriers
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) buffer G { float g[]; };
layout(push_constant) uniform Push {
  uint rows, row_length;
} p;

void main() {
  uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.rows) return;  // the whole workgroup: its barriers stay in uniform control flow
  uint first = (gl_WorkGroupID.z * p.rows + row) * p.row_length, lane = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
  float dot = 0.0;
  for (uint i = lane; i < p.row_length; i += step) dot += a[first + i] * g[first + i];
  dot = SUBGROUP_SUM ? subgroupAdd(dot) : workgroup_sum(vec2(dot, 0.0)).x;
  for (uint i = lane; i < p.row_length; i += step) g[first + i] = a[first + i] * (g[first + i] - dot);
}
