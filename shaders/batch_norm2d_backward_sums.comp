#version 450
// --sync-bn, before the replicas exchange: the parameter gradients and this replica's two sums
// per channel (see batch_norm2d_backward.glsl).
#define SUMS_OUT
#include "batch_norm2d_backward.glsl"
