#version 450
// A batch's loss and correct predictions added to the running metrics, summed within subgroups
// first (metrics_accumulate.glsl, reduce.glsl).
#define TESSERA_SUBGROUP_REDUCE
#include "metrics_accumulate.glsl"
