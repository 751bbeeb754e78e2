#version 450
// The slices' moments of each channel (batch_norm2d_moments.comp) merged in slice order by Chan
// et al.'s rule into statistics[c] = mean and statistics[channels + c] = biased variance, what
// batch_norm2d_forward_synced.comp normalises with. One invocation per channel.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Moments { float moments[]; };
layout(std430, binding = 1) writeonly buffer Statistics { float statistics[]; };
layout(push_constant) uniform Push { uint count, channels, slice_length, slices; } p;
void main() {
  uint c = gl_GlobalInvocationID.x;
  if (c >= p.channels) return;
  float n = 0.0, mean = 0.0, m2 = 0.0;
  for (uint slice = 0u; slice < p.slices; ++slice) {
    float size = float(min(p.slice_length, p.count - slice * p.slice_length));
    float delta = moments[2u * slice * p.channels + c] - mean, total = n + size;
    mean += delta * (size / total);
    m2 += moments[(2u * slice + 1u) * p.channels + c] + delta * delta * (n * size / total);
    n = total;
  }
  statistics[c] = mean;
  statistics[p.channels + c] = m2 / n;
}
