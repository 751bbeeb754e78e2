#version 450
// Batch norm backward: parameter gradients and dx (see batch_norm2d_backward.glsl).
#define INPUT_GRAD
#include "batch_norm2d_backward.glsl"
