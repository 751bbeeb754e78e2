#version 450
// The bias gradient, summed through shared memory (bias_backward.glsl).
#include "bias_backward.glsl"
