#version 450
// A batch's loss and correct predictions added to the running metrics, summed through shared
// memory (metrics_accumulate.glsl).
#include "metrics_accumulate.glsl"
