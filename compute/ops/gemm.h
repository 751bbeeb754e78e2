// What the GEMM-shaped ops (conv2d, linear) share: tile shapes per device, a strided matrix
// product and the bias gradient.
#pragma once
#include <cstdint>
#include <utility>

#include "compute/tensor.h"
#include "compute/vk/kernels.h"
#include "compute/vk/recorder.h"

namespace tessera {

// The register block of shaders/gemm_block.glsl: `group` invocations per workgroup, each
// computing `rows` x `columns` outputs; with share_columns (group is one subgroup, columns a
// multiple of it) each invocation loads 1/group of the shared B row and shuffles the rest in.
struct GemmTiles {
  int32_t group, rows, columns;
  bool share_columns;
  int32_t reduction_unroll;  // reduction steps loaded ahead of their FMAs
};
// The tiles for a product with M rows on `target`: CPU devices (lavapipe) want large blocks per
// invocation, since loads cost far more than FMAs there; GPUs want many invocations. Fewer rows
// per invocation where M is too small to fill a workgroup's blocks (a 3-channel image), rounded
// up to a power of two so that few pipelines are built. The GEMM-shaped ops record with the
// tiles of kernels.tile_target().
GemmTiles gemm_tiles(const vk::TileTarget& target, int64_t M);

// Workgroups (y, z) that count `blocks` column blocks without passing the y limit.
std::pair<uint32_t, uint32_t> column_groups(uint64_t blocks);

// Element (row, col) of a strided matrix is at row * row_stride + col * col_stride.
struct MatrixView {
  const Tensor* tensor;
  uint32_t row_stride, col_stride;
};

// c[M,N] (+)= a[M,K] b[K,N] (+ bias[m] for each row m, where bias is given); relu (not with
// accumulate): c = max(c, 0), a fused ReLU. Any operand may be fp16; sums are float.
void record_gemm(vk::Recorder& recorder, vk::Kernels& kernels, uint32_t M, uint32_t N, uint32_t K,
                 MatrixView a, MatrixView b, MatrixView c, bool accumulate, const Tensor* bias = nullptr,
                 bool relu = false);

// dbias[o] += sum_{n,i} dy[n,o,i] for dy [batch, channels, pixels].
void record_bias_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& dy,
                          const Tensor& dbias, uint32_t batch, uint32_t channels, uint32_t pixels);

}  // namespace tessera
