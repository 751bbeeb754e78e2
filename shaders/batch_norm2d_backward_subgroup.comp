#version 450
// batch_norm2d_backward.comp with the channel sums added within subgroups first (reduce.glsl).
#define TESSERA_SUBGROUP_REDUCE
#define INPUT_GRAD
#include "batch_norm2d_backward.glsl"
