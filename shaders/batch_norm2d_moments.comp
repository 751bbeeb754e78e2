#version 450
// --sync-bn, before the replicas exchange: this replica's mean and M2 of each channel,
// moments[c] and moments[channels + c], which the trainer combines over every replica.
#include "common.glsl"
#include "batch_norm2d.glsl"
layout(local_size_x_id = 0) in;
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) writeonly buffer Moments { float moments[]; };
layout(push_constant) uniform Push { uint batch, channels, plane; } p;
#include "batch_norm2d_moments.glsl"
void main() {
  uint c = gl_WorkGroupID.x;
  vec2 local = channel_moments(c, gl_LocalInvocationID.x, p.batch * p.plane, p.channels, p.plane);
  if (gl_LocalInvocationID.x == 0u) {
    moments[c] = local.x;
    moments[p.channels + c] = local.y;
  }
}
