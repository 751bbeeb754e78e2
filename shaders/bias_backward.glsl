// dbias[o] += sum_{n,i} dy[n,o,i] for dy [N,O,pixels]: the bias gradient of conv2d
// (pixels = OH*OW) and of linear (pixels = 1). One workgroup per channel: a channel's sum
// runs over N*OH*OW values, far too many for one invocation. The reduction order is fixed,
// so the result is the same on every run.
#include "common.glsl"
layout(local_size_x = 64) in;
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer DY { ACT dy[]; };
layout(std430, binding = 1) buffer DBias { float dbias[]; };
layout(push_constant) uniform Push { uint batch, channels, pixels; } p;
void main() {
  uint o = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  // The invocations share the (image, pixel) pairs, so that none loops more than their count
  // over the workgroup: a linear layer's batch is a MIL bag's rows, a hundred thousand and more,
  // and llvmpipe ends an invocation's loops after 65,535 iterations.
  float sum = 0.0;
  uint pairs = p.batch * p.pixels;
  for (uint e = t; e < pairs; e += gl_WorkGroupSize.x) {
    uint n = e / p.pixels, i = e % p.pixels;
    sum += float(dy[(n * p.channels + o) * p.pixels + i]);
  }
  float total = workgroup_sum(vec2(sum, 0.0)).x;
  if (t == 0u) dbias[o] += total;
}
