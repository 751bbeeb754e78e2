#version 450
// In place, g [batch, rows, length] becomes the gradient of the scores under a row softmax a
// of the same shape: g (a row's) -> a * (g - sum_j a_j g_j), one workgroup a row. Where the rows
// are softmaxes over the whole sequence held a chunk of columns at a time (head_dim > 0: a is
// softmax(ql k^T) a3, g its gradient dw v^T for w = a3 v), the row's sum over every column is
// dw_i . w_i, from dw and w [batch, rows, head_dim]. Entries that the forward softmax wrote 0
// (past the sequence) stay 0; the padding's zero scores lead to constant keys, so their
// gradients are not needed.
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SUBGROUP_SUM = false;  // the workgroup is one subgroup: no barriers
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) buffer G { float g[]; };
layout(std430, binding = 2) readonly buffer GradW { float grad_w[]; };
layout(std430, binding = 3) readonly buffer W { float w[]; };
layout(push_constant) uniform Push {
  uint rows, row_length, head_dim;
} p;

void main() {
  uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.rows) return;  // the whole workgroup: its barriers stay in uniform control flow
  uint at = gl_WorkGroupID.z * p.rows + row, first = at * p.row_length;
  uint lane = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
  float dot = 0.0;
  if (p.head_dim > 0u)
    for (uint i = lane; i < p.head_dim; i += step) dot += grad_w[at * p.head_dim + i] * w[at * p.head_dim + i];
  else
    for (uint i = lane; i < p.row_length; i += step) dot += a[first + i] * g[first + i];
  dot = SUBGROUP_SUM ? subgroupAdd(dot) : workgroup_sum(vec2(dot, 0.0)).x;
  for (uint i = lane; i < p.row_length; i += step) g[first + i] = a[first + i] * (g[first + i] - dot);
}
