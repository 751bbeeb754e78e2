#version 450
// batch_norm2d_backward_parameters.comp with the channel sums added within subgroups first
// (reduce.glsl).
#define TESSERA_SUBGROUP_REDUCE
#include "batch_norm2d_backward.glsl"
