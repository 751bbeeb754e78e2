// The batch norm forward kernel:
//   y = (x - mean[c]) * invstd[c] * weight[c] + bias[c]
// Training: mean and biased variance of the batch, saved for backward; running_mean and
// running_var move towards them by momentum (the variance unbiased over `total` elements, as
// PyTorch). SYNCED (--sync-bn): the mean and variance of every replica's batch together,
// statistics[c] and statistics[channels + c], combined by the trainer from each replica's
// moments (batch_norm2d_moments.comp), or on a GPU from slices of this batch's
// (batch_norm2d_combine_moments.comp); then each workgroup normalises its slice (workgroup y)
// of the channel. Evaluation: the running statistics. RELU: a ReLU fused in, y = max(y, 0).
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
#ifdef SYNCED
layout(std430, binding = 8) readonly buffer Statistics { float statistics[]; };
#endif
layout(push_constant) uniform Push {
  uint batch, channels, plane;
  float eps, momentum;
  uint training, total, slice_length;
} p;
#include "batch_norm2d_moments.glsl"
void main() {
  uint c = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, count = p.batch * p.plane;
  uint begin = gl_WorkGroupID.y * p.slice_length, end = min(begin + p.slice_length, count);
  bool first = gl_WorkGroupID.y == 0u && t == 0u;  // writes the channel's running and saved statistics
  float mean, invstd;
  if (p.training != 0u) {
#ifdef SYNCED
    mean = statistics[c];
    float variance = statistics[p.channels + c];
#else
    vec2 moments = channel_moments(c, t, 0u, count, p.channels, p.plane);
    mean = moments.x;
    float variance = moments.y / float(count);
#endif
    invstd = inversesqrt(variance + p.eps);
    if (first) {
      float unbiased = variance * float(p.total) / float(max(p.total, 2u) - 1u);
      running_mean[c] = (1.0 - p.momentum) * running_mean[c] + p.momentum * mean;
      running_var[c] = (1.0 - p.momentum) * running_var[c] + p.momentum * unbiased;
    }
  } else {
    mean = running_mean[c];
    invstd = inversesqrt(running_var[c] + p.eps);
  }
  if (first) {
    saved_mean[c] = mean;
    saved_invstd[c] = invstd;
  }
  float scale = weight[c] * invstd, shift = bias[c] - mean * scale;
  for (uint j = begin + t; j < end; j += gl_WorkGroupSize.x) {
    uint i = channel_element(c, j, p.channels, p.plane);
    float value = float(x[i]) * scale + shift;
    y[i] = ACT(RELU ? relu(value) : value);
  }
}
