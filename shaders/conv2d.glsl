// What the conv2d kernels share: shapes as push constants. Layouts are PyTorch's: x [N,C,H,W],
// weight [O,C,KH,KW], y [N,O,OH,OW].
#ifndef TESSERA_CONV2D_GLSL
#define TESSERA_CONV2D_GLSL

layout(push_constant) uniform Push {
  uint batch, C, H, W;
  uint O, OH, OW;
  uint KH, KW, stride, pad;
  uint k_per_slice;  // backward weight: the reduction length of one split-K slice
  uint accumulate;   // add to the output instead of overwriting it
} p;

#endif
