#version 450
// Batch norm forward with statistics over every replica (--sync-bn).
#define SYNCED
#include "batch_norm2d_forward.glsl"
