#version 450
// batch_norm2d_backward_sums.comp (--sync-bn) with the channel sums added within subgroups
// first (reduce.glsl).
#define TESSERA_SUBGROUP_REDUCE
#define SUMS_OUT
#include "batch_norm2d_backward.glsl"
