#version 450
// Batch norm backward where no gradient flows to the input: dweight and dbias only.
#include "batch_norm2d_backward.glsl"
