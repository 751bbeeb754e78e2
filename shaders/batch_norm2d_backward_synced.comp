#version 450
// --sync-bn, after the replicas exchange: dx from the sums of every replica's batch,
// sums[c] = sum dy and sums[channels + c] = sum dy * xhat over `total` elements per channel.
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
  uint batch, channels, plane, training, accumulate, total;
} p;
float gradient(uint i) { return RELU ? (float(y[i]) > 0.0 ? float(dy[i]) : 0.0) : float(dy[i]); }
#include "batch_norm2d_input_grad.glsl"
void main() {
  uint c = gl_WorkGroupID.x;
  write_input_grad(c, gl_LocalInvocationID.x, p.batch * p.plane,
                   vec2(sums[c], sums[p.channels + c]) / float(p.total));
}
