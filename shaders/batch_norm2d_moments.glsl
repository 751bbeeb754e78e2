// A channel's mean and sum of squared deviations (M2) over its elements [begin, end), in two
// passes (no cancellation for large means). Include after declaring the input as `x`.
#ifndef TESSERA_BATCH_NORM2D_MOMENTS_GLSL
#define TESSERA_BATCH_NORM2D_MOMENTS_GLSL

vec2 channel_moments(uint c, uint t, uint begin, uint end, uint channels, uint plane) {
  float sum = 0.0;
  for (uint j = begin + t; j < end; j += gl_WorkGroupSize.x) sum += float(x[channel_element(c, j, channels, plane)]);
  float mean = workgroup_sum(vec2(sum, 0.0)).x / float(end - begin);
  float squares = 0.0;
  for (uint j = begin + t; j < end; j += gl_WorkGroupSize.x) {
    float d = float(x[channel_element(c, j, channels, plane)]) - mean;
    squares += d * d;
  }
  return vec2(mean, workgroup_sum(vec2(squares, 0.0)).x);
}

#endif
