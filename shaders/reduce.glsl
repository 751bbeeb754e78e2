// A sum over the invocations of a workgroup, for kernels that give one workgroup to one
// reduction (a channel's statistics). Include after the local_size declaration; the
// workgroup size must be a power of two, and every invocation must call it.
#ifndef TESSERA_REDUCE_GLSL
#define TESSERA_REDUCE_GLSL

shared vec2 reduce_scratch[gl_WorkGroupSize.x];

vec2 workgroup_sum(vec2 value) {
  uint t = gl_LocalInvocationID.x;
  reduce_scratch[t] = value;
  barrier();
  for (uint half_size = gl_WorkGroupSize.x / 2u; half_size > 0u; half_size >>= 1) {
    if (t < half_size) reduce_scratch[t] += reduce_scratch[t + half_size];
    barrier();
  }
  vec2 total = reduce_scratch[0];
  barrier();  // the scratch may be reused at once
  return total;
}

#endif
