// What the shared-memory tiled conv2d kernels share (conv2d.glsl's counterpart for
// gemm_tiled.glsl): the same layouts and push constants; the kernel size and stride are the
// specialization constants after the tiles'.
#ifndef TESSERA_CONV2D_TILED_GLSL
#define TESSERA_CONV2D_TILED_GLSL

layout(constant_id = 6) const uint KH = 3;
layout(constant_id = 7) const uint KW = 3;
layout(constant_id = 8) const uint STRIDE = 1;
const uint TAPS = KH * KW;

#include "conv2d_push.glsl"

#endif
