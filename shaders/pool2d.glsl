// Shared by the max and average pooling kernels: the geometry of a square window over
// planes of NCHW tensors, as push constants.
#ifndef TESSERA_POOL2D_GLSL
#define TESSERA_POOL2D_GLSL

layout(push_constant) uniform Push {
  uint count;  // elements the dispatch covers: output elements in forward, input in backward
  uint in_h, in_w, out_h, out_w;
  uint kernel_size, stride;
  int padding;
  uint accumulate;  // backward: add to the input gradient instead of overwriting it
} p;

// The output rows (or columns) whose windows contain input row `i`: [first, last], maybe empty.
ivec2 covering_windows(int i, uint out_size) {
  int first = max(0, (i + p.padding - int(p.kernel_size) + int(p.stride)) / int(p.stride));
  int last = min(int(out_size) - 1, (i + p.padding) / int(p.stride));
  return ivec2(first, last);
}

#endif
