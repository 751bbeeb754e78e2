#version 450
// The mean and M2 of each channel over one slice of its elements (workgroup y: slice y of
// `slice_length`), moments[2 * slice * channels + c] and moments[(2 * slice + 1) * channels + c].
// --sync-bn: one slice, this replica's, which the trainer combines over every replica; a GPU's
// training forward: several, which batch_norm2d_combine_moments.comp combines.
#include "common.glsl"
#include "batch_norm2d.glsl"
layout(local_size_x_id = 0) in;
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) writeonly buffer Moments { float moments[]; };
layout(push_constant) uniform Push { uint batch, channels, plane, slice_length; } p;
#include "batch_norm2d_moments.glsl"
void main() {
  uint c = gl_WorkGroupID.x, slice = gl_WorkGroupID.y;
  uint begin = slice * p.slice_length, end = min(begin + p.slice_length, p.batch * p.plane);
  vec2 local = channel_moments(c, gl_LocalInvocationID.x, begin, end, p.channels, p.plane);
  if (gl_LocalInvocationID.x == 0u) {
    moments[2u * slice * p.channels + c] = local.x;
    moments[(2u * slice + 1u) * p.channels + c] = local.y;
  }
}
