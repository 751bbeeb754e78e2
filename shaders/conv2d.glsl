// What the conv2d kernels share. Layouts are PyTorch's: x [N,C,H,W], weight [O,C,KH,KW],
// y [N,O,OH,OW]. The stride is a specialization constant (backward data divides by it on every
// step); the kernel's size and the other shapes are push constants, so that one pipeline serves
// every kernel size of a stride: llvmpipe compiles each of these kernels for seconds.
#ifndef TESSERA_CONV2D_GLSL
#define TESSERA_CONV2D_GLSL

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TM = 4;
layout(constant_id = 2) const int TN = 16;
layout(constant_id = 3) const uint STRIDE = 1;
layout(constant_id = 4) const bool SHARE_B = false;
layout(constant_id = 5) const int K_UNROLL = 1;
// Forward's weight layout [ceil(C*KH*KW / WEIGHT_BLOCK), O, WEIGHT_BLOCK]: conv2d_forward_weight.comp.
layout(constant_id = 6) const uint WEIGHT_BLOCK = 16;
// Forward: a batch norm folded in (inference, Epilogue::batch_norm); its epilogue.glsl's
// constants follow.
layout(constant_id = 7) const bool FOLD = false;
const bool SHARE_K = false;  // b_values follow the seek/step counters

#include "conv2d_push.glsl"
#define KH p.kernel_h
#define KW p.kernel_w
#define TAPS (p.kernel_h * p.kernel_w)

#endif
