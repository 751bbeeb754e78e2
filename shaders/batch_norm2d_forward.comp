#version 450
// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c]. Training: mean and biased variance of
// the batch, saved for backward; running_mean and running_var move towards them by momentum
// (the variance unbiased, as PyTorch). Evaluation: the running statistics. RELU: a ReLU fused
// in, y = max(y, 0).
#include "common.glsl"
#include "batch_norm2d.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool RELU = false;
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) buffer RunningMean { float running_mean[]; };
layout(std430, binding = 4) buffer RunningVar { float running_var[]; };
layout(std430, binding = 5) writeonly buffer Mean { float saved_mean[]; };
layout(std430, binding = 6) writeonly buffer Invstd { float saved_invstd[]; };
layout(std430, binding = 7) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push {
  uint batch, channels, plane;
  float eps, momentum;
  uint training;
} p;
void main() {
  uint c = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, count = p.batch * p.plane;
  float mean, invstd;
  if (p.training != 0u) {
    // Two passes, mean then squared deviations: no cancellation for large means.
    float sum = 0.0;
    for (uint j = t; j < count; j += gl_WorkGroupSize.x) sum += float(x[channel_element(c, j, p.channels, p.plane)]);
    mean = workgroup_sum(vec2(sum, 0.0)).x / float(count);
    float squares = 0.0;
    for (uint j = t; j < count; j += gl_WorkGroupSize.x) {
      float d = float(x[channel_element(c, j, p.channels, p.plane)]) - mean;
      squares += d * d;
    }
    float variance = workgroup_sum(vec2(squares, 0.0)).x / float(count);
    invstd = inversesqrt(variance + p.eps);
    if (t == 0u) {
      float unbiased = variance * float(count) / float(max(count, 2u) - 1u);
      running_mean[c] = (1.0 - p.momentum) * running_mean[c] + p.momentum * mean;
      running_var[c] = (1.0 - p.momentum) * running_var[c] + p.momentum * unbiased;
    }
  } else {
    mean = running_mean[c];
    invstd = inversesqrt(running_var[c] + p.eps);
  }
  if (t == 0u) {
    saved_mean[c] = mean;
    saved_invstd[c] = invstd;
  }
  float scale = weight[c] * invstd, shift = bias[c] - mean * scale;
  for (uint j = t; j < count; j += gl_WorkGroupSize.x) {
    uint i = channel_element(c, j, p.channels, p.plane);
    float value = float(x[i]) * scale + shift;
    y[i] = ACT(RELU ? relu(value) : value);
  }
}
