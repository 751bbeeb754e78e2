// Shared by the batch norm kernels: one workgroup per channel of an [N,C,H,W] (or [N,C])
// tensor; the channel's N*H*W elements are spread over the workgroup's invocations.
#ifndef TESSERA_BATCH_NORM2D_GLSL
#define TESSERA_BATCH_NORM2D_GLSL

// Where the j-th element of channel c lies, j in [0, batch * plane).
uint channel_element(uint c, uint j, uint channels, uint plane) {
  uint n = j / plane;
  return (n * channels + c) * plane + (j - n * plane);
}

#endif
