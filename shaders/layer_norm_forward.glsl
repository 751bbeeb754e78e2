// Layer normalisation over the last dimension, PyTorch's nn.LayerNorm with an affine weight
// and bias: y = (x - mean) / sqrt(var + eps) * weight + bias, one workgroup per row. Mean and
// variance take two passes over the row: a ViT's residual stream holds values in the hundreds,
// where E[x^2] - mean^2 cancels in float. With LAYER_NORM_SAVE_STATISTICS (training) each
// row's mean and inverse std are also stored, for backward (layer_norm_backward_*.comp).
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SUBGROUP_SUM = false;  // the workgroup is one subgroup: no barriers
#include "reduce.glsl"
layout(binding = 0) uniform samplerBuffer x;
layout(binding = 1, r32f) uniform readonly imageBuffer weight;
layout(binding = 2, r32f) uniform readonly imageBuffer bias;
layout(std430, binding = 3) writeonly buffer Y { ACT y[]; };
#ifdef LAYER_NORM_SAVE_STATISTICS
layout(std430, binding = 4) writeonly buffer Statistics { vec2 statistics[]; };  // [rows]: mean, inverse std
#endif
layout(push_constant) uniform Push {
  uint rows, width;
  float eps;
} p;

float row_sum(float value) { return SUBGROUP_SUM ? subgroupAdd(value) : workgroup_sum(vec2(value, 0.0)).x; }

void main() {
  uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.rows) return;  // the whole workgroup: its barriers stay in uniform control flow
  uint first = row * p.width, lane = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
  float sum = 0.0;
  for (uint i = lane; i < p.width; i += step) sum += texelFetch(x, int(first + i)).x;
  float mean = row_sum(sum) / float(p.width);
  float squares = 0.0;
  for (uint i = lane; i < p.width; i += step) {
    float deviation = texelFetch(x, int(first + i)).x - mean;
    squares += deviation * deviation;
  }
  float inverse_std = 1.0 / sqrt(row_sum(squares) / float(p.width) + p.eps);
#ifdef LAYER_NORM_SAVE_STATISTICS
  if (lane == 0u) statistics[row] = vec2(mean, inverse_std);
#endif
  for (uint i = lane; i < p.width; i += step) {
    float normalised = (texelFetch(x, int(first + i)).x - mean) * inverse_std;
    y[first + i] = ACT(normalised * imageLoad(weight, int(i)).x + imageLoad(bias, int(i)).x);
  }
}
