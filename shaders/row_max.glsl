// The largest value over the invocations of a workgroup that gives one workgroup to one row (the
// softmaxes of nystrom_attention), for kernels with reduce.glsl's SUBGROUP_SUM constant: one
// subgroupMax where the workgroup is one subgroup, else halvings through shared memory. Every
// invocation must call it, and every one gets the same maximum.
#ifndef TESSERA_ROW_MAX_GLSL
#define TESSERA_ROW_MAX_GLSL

shared float row_max_scratch[gl_WorkGroupSize.x];

float row_max(float value) {
  if (SUBGROUP_SUM) return subgroupMax(value);
  uint t = gl_LocalInvocationID.x;
  row_max_scratch[t] = value;
  barrier();
  for (uint half_size = gl_WorkGroupSize.x / 2u; half_size > 0u; half_size >>= 1) {
    if (t < half_size) row_max_scratch[t] = max(row_max_scratch[t], row_max_scratch[t + half_size]);
    barrier();
  }
  float result = row_max_scratch[0];
  barrier();
  return result;
}

#endif
