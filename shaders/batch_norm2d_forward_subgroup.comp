#version 450
// batch_norm2d_forward.comp with the channel statistics summed within subgroups first (reduce.glsl).
#define TESSERA_SUBGROUP_REDUCE
#include "batch_norm2d_forward.glsl"
