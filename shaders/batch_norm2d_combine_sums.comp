#version 450
// The slices' backward sums of each channel (batch_norm2d_backward_sums.comp) added in slice
// order: sums[c] = sum dy and sums[channels + c] = sum dy * xhat, for
// batch_norm2d_backward_synced.comp, and the parameter gradients, dbias[c] += sum dy and
// dweight[c] += sum dy * xhat. One invocation per channel.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Partial { float partial[]; };
layout(std430, binding = 1) writeonly buffer Sums { float sums[]; };
layout(std430, binding = 2) buffer DWeight { float dweight[]; };
layout(std430, binding = 3) buffer DBias { float dbias[]; };
layout(push_constant) uniform Push { uint count, channels, slice_length, slices; } p;
void main() {
  uint c = gl_GlobalInvocationID.x;
  if (c >= p.channels) return;
  vec2 total = vec2(0.0);
  for (uint slice = 0u; slice < p.slices; ++slice)
    total += vec2(partial[2u * slice * p.channels + c], partial[(2u * slice + 1u) * p.channels + c]);
  sums[c] = total.x;
  sums[p.channels + c] = total.y;
  dbias[c] += total.x;
  dweight[c] += total.y;
}
