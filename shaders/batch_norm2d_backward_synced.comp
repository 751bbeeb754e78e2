#version 450
// After --sync-bn's exchange or a GPU's batch_norm2d_combine_sums.comp: dx from the sums of the
// whole batch, sums[c] = sum dy and sums[channels + c] = sum dy * xhat over `total` elements per
// channel; each workgroup its slice (workgroup y) of the channel.
#include "common.glsl"
#include "batch_norm2d.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool RELU = false;
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, binding = 2) readonly buffer Mean { float saved_mean[]; };
layout(std430, binding = 3) readonly buffer Invstd { float saved_invstd[]; };
layout(std430, binding = 4) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 5) readonly buffer Y { ACT y[]; };  // unread without RELU
layout(std430, binding = 6) readonly buffer Sums { float sums[]; };
layout(std430, binding = 7) buffer DX { ACT dx[]; };
layout(push_constant) uniform Push {
  uint batch, channels, plane, training, accumulate, total, slice_length;
} p;
float gradient(uint i) { return RELU ? (float(y[i]) > 0.0 ? float(dy[i]) : 0.0) : float(dy[i]); }
#include "batch_norm2d_input_grad.glsl"
void main() {
  uint c = gl_WorkGroupID.x, begin = gl_WorkGroupID.y * p.slice_length;
  write_input_grad(c, gl_LocalInvocationID.x, begin, min(begin + p.slice_length, p.batch * p.plane),
                   vec2(sums[c], sums[p.channels + c]) / float(p.total));
}
