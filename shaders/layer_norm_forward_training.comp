#version 450
// LayerNorm forward in training: also stores each row's mean and inverse std for backward
// (layer_norm_forward.glsl).
#define LAYER_NORM_SAVE_STATISTICS
#include "layer_norm_forward.glsl"
