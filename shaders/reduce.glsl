// A sum over the invocations of a workgroup, for kernels that give one workgroup to one
// reduction (a channel's statistics). Include after the local_size declaration; the
// workgroup size must be a power of two, and every invocation must call it. Every invocation
// gets the same sum, added in a fixed order, so results repeat bit for bit on a device.
//
// With TESSERA_SUBGROUP_REDUCE (a kernel's *_subgroup variant, for devices with subgroup
// arithmetic: op.h's reduction_kernel) each subgroup adds its values first (subgroupAdd) and
// the workgroup then adds the subgroups' sums: two barriers instead of one per halving.
#ifndef TESSERA_REDUCE_GLSL
#define TESSERA_REDUCE_GLSL

shared vec2 reduce_scratch[gl_WorkGroupSize.x];

#ifdef TESSERA_SUBGROUP_REDUCE
#extension GL_KHR_shader_subgroup_arithmetic : require

vec2 workgroup_sum(vec2 value) {
  vec2 sum = subgroupAdd(value);
  if (subgroupElect()) reduce_scratch[gl_SubgroupID] = sum;
  barrier();
  vec2 total = vec2(0.0);
  for (uint s = 0u; s < gl_NumSubgroups; ++s) total += reduce_scratch[s];
  barrier();  // the scratch may be reused at once
  return total;
}

#else

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
#endif
