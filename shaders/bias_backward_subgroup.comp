#version 450
// The bias gradient, summed within subgroups first (bias_backward.glsl, reduce.glsl).
#define TESSERA_SUBGROUP_REDUCE
#include "bias_backward.glsl"
