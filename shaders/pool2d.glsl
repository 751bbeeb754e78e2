// Shared by the max and average pooling kernels: the geometry of a square window over
// planes of NCHW tensors, as specialization constants, so that every index division is by a
// constant (a multiply and a shift; a division by a push constant is not vectorised on CPU
// devices and costs more than the rest of the kernel).
#ifndef TESSERA_POOL2D_GLSL
#define TESSERA_POOL2D_GLSL

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint IN_H = 1;
layout(constant_id = 2) const uint IN_W = 1;
layout(constant_id = 3) const uint OUT_H = 1;
layout(constant_id = 4) const uint OUT_W = 1;
layout(constant_id = 5) const uint KERNEL_SIZE = 1;
layout(constant_id = 6) const uint STRIDE = 1;
layout(constant_id = 7) const int PADDING = 0;
// Backward: the windows cover the input exactly once, so one invocation per window writes the
// gradient of all its inputs (Pool2d::windows_tile_input).
layout(constant_id = 8) const bool TILED = false;

layout(push_constant) uniform Push {
  uint count;       // elements the dispatch covers: output elements in forward, input in backward
  uint accumulate;  // backward: add to the input gradient instead of overwriting it
} p;

// The output rows (or columns) whose windows contain input row `i`: [first, last], maybe empty.
ivec2 covering_windows(int i, uint out_size) {
  int first = max(0, (i + PADDING - int(KERNEL_SIZE) + int(STRIDE)) / int(STRIDE));
  int last = min(int(out_size) - 1, (i + PADDING) / int(STRIDE));
  return ivec2(first, last);
}

#endif
