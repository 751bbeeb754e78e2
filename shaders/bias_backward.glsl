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
  float sum = 0.0;
  for (uint n = 0u; n < p.batch; ++n) {
    uint row = (n * p.channels + o) * p.pixels;
    for (uint i = t; i < p.pixels; i += gl_WorkGroupSize.x) sum += float(dy[row + i]);
  }
  float total = workgroup_sum(vec2(sum, 0.0)).x;
  if (t == 0u) dbias[o] += total;
}
