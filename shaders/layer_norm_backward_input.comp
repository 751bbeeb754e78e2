#version 450
// LayerNorm's input gradient, one workgroup per row as forward: with xhat = (x - mean) * inverse_std
// and g = dy * weight, dx = inverse_std * (g - mean(g) - xhat * mean(g * xhat)) over the row
// (PyTorch's layer_norm_backward), written or added to dx (accumulate). mean and inverse_std are
// what forward saved (layer_norm_forward_training.comp).
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SUBGROUP_SUM = false;  // the workgroup is one subgroup: no barriers
#include "reduce.glsl"
layout(binding = 0) uniform samplerBuffer x;
layout(binding = 1, r32f) uniform readonly imageBuffer weight;
layout(binding = 2, r32f) uniform readonly imageBuffer statistics;  // [rows, 2]: mean, inverse std
layout(binding = 3, ACT_TEXELS) uniform readonly imageBuffer dy;
layout(std430, binding = 4) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push { uint rows, width, accumulate; } p;

vec2 row_sum(vec2 value) { return SUBGROUP_SUM ? subgroupAdd(value) : workgroup_sum(value); }

void main() {
  uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.rows) return;  // the whole workgroup: its barriers stay in uniform control flow
  uint first = row * p.width, lane = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
  float mean = imageLoad(statistics, int(2u * row)).x, inverse_std = imageLoad(statistics, int(2u * row + 1u)).x;
  vec2 sums = vec2(0.0);  // g, g * xhat
  for (uint i = lane; i < p.width; i += step) {
    float g = imageLoad(dy, int(first + i)).x * imageLoad(weight, int(i)).x;
    float normalised = (texelFetch(x, int(first + i)).x - mean) * inverse_std;
    sums += vec2(g, g * normalised);
  }
  vec2 means = row_sum(sums) / float(p.width);
  for (uint i = lane; i < p.width; i += step) {
    float g = imageLoad(dy, int(first + i)).x * imageLoad(weight, int(i)).x;
    float normalised = (texelFetch(x, int(first + i)).x - mean) * inverse_std;
    float grad = inverse_std * (g - means.x - normalised * means.y);
    dx[first + i] = ACT(p.accumulate != 0u ? float(dx[first + i]) + grad : grad);
  }
}
