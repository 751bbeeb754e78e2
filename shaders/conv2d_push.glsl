// The push constants of every conv2d kernel (Conv2d::Push): the register-blocked ones
// (conv2d.glsl) and the shared-memory tiled ones (conv2d_tiled.glsl).
#ifndef TESSERA_CONV2D_PUSH_GLSL
#define TESSERA_CONV2D_PUSH_GLSL

layout(push_constant) uniform Push {
  uint batch, C, H, W;
  uint O, OH, OW;
  uint pad;
  uint k_per_slice;  // backward weight: the reduction length of one split-K slice
  uint accumulate;   // add to the output instead of overwriting it
  uint has_bias;     // forward
  float eps;         // forward with FOLD: the batch norm's epsilon
  uint phase_row;    // backward data: the input pixels whose (ih + pad) % STRIDE is this
  uint phase_col;    // and whose (iw + pad) % STRIDE is this
  uint kernel_h, kernel_w;  // the register-blocked kernels' (conv2d.glsl); the tiled ones' are constants
} p;

#endif
