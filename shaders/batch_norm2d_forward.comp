#version 450
// Batch norm forward with this replica's (or the one device's) batch statistics.
#include "batch_norm2d_forward.glsl"
