#version 450
// LayerNorm forward in inference (layer_norm_forward.glsl).
#include "layer_norm_forward.glsl"
