// The batch norm backward kernel; with INPUT_GRAD it also writes dx, without it (the input
// is the network's own input, or --sync-bn's first half) only the parameter gradients.
//   dbias[c] += sum dy, dweight[c] += sum dy * xhat, with xhat = (x - mean[c]) * invstd[c]
//   training:   dx (+)= weight[c] * invstd[c] * (dy - (sum dy + xhat * sum dy * xhat) / M)
//   evaluation: dx (+)= weight[c] * invstd[c] * dy  (the statistics are constants)
// SUMS_OUT: the channel's two sums are written out too, before batch_norm2d_backward_synced.comp
// writes dx: with --sync-bn for the trainer to add up over every replica; on a GPU, one slice's
// (workgroup y) for batch_norm2d_combine_sums.comp, which then adds the parameter gradients.
// RELU (a ReLU fused into the forward): dy is first masked by the fused output, y > 0.
#include "common.glsl"
#include "batch_norm2d.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool RELU = false;
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer X { ACT x[]; };
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, binding = 2) readonly buffer Mean { float saved_mean[]; };
layout(std430, binding = 3) readonly buffer Invstd { float saved_invstd[]; };
layout(std430, binding = 4) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 5) buffer DWeight { float dweight[]; };
layout(std430, binding = 6) buffer DBias { float dbias[]; };
layout(std430, binding = 7) readonly buffer Y { ACT y[]; };  // unread without RELU
#ifdef INPUT_GRAD
layout(std430, binding = 8) buffer DX { ACT dx[]; };
#endif
#ifdef SUMS_OUT
layout(std430, binding = 8) writeonly buffer Sums { float sums_out[]; };
#endif
layout(push_constant) uniform Push {
  uint batch, channels, plane, training, accumulate, total, slice_length;
} p;
float gradient(uint i) { return RELU ? (float(y[i]) > 0.0 ? float(dy[i]) : 0.0) : float(dy[i]); }
#ifdef INPUT_GRAD
#include "batch_norm2d_input_grad.glsl"
#endif
void main() {
  uint c = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, count = p.batch * p.plane;
  uint slice = gl_WorkGroupID.y, begin = slice * p.slice_length, end = min(begin + p.slice_length, count);
  float mean = saved_mean[c], invstd = saved_invstd[c];
  vec2 partial = vec2(0.0);  // (sum dy, sum dy * xhat)
  for (uint j = begin + t; j < end; j += gl_WorkGroupSize.x) {
    uint i = channel_element(c, j, p.channels, p.plane);
    float g = gradient(i);
    partial += vec2(g, g * (float(x[i]) - mean) * invstd);
  }
  vec2 sums = workgroup_sum(partial);
  if (t == 0u && gl_NumWorkGroups.y == 1u) {
    dbias[c] += sums.x;
    dweight[c] += sums.y;
  }
#ifdef SUMS_OUT
  if (t == 0u) {
    sums_out[2u * slice * p.channels + c] = sums.x;
    sums_out[(2u * slice + 1u) * p.channels + c] = sums.y;
  }
#endif
#ifdef INPUT_GRAD
  write_input_grad(c, t, begin, end, p.training != 0u ? sums / float(count) : vec2(0.0));
#endif
}
