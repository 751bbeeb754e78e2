// What the GEMM-shaped ops (conv2d, linear) share: tile shapes per device, a strided matrix
// product and the bias gradient.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "compute/op.h"
#include "compute/tensor.h"
#include "compute/vk/kernels.h"
#include "compute/vk/recorder.h"

namespace tessera {

// The largest GEMM dimension a dispatch covers in one workgroup count (a linear layer's input
// features, rows of its input gradient; a convolution's in_channels x kernel area, columns of its
// weight gradient): 2^20 is 65535 workgroups (Vulkan's guaranteed count) of 16 rows or columns,
// fewer than any tile shape takes. No real layer comes near: VGG's classifier reads 25088.
constexpr int64_t kMaxGemmDimension = int64_t{1} << 20;

// Which kernels the GEMM-shaped ops record. registers: shaders/gemm_block.glsl, blocks in
// registers shared by subgroup shuffles, no barriers (CPU devices: lavapipe, where loads cost
// far more than FMAs and a barrier switches every lane's coroutine: 25x the GFLOPS of the
// shared-memory tiles on lavapipe). shared_memory:
// shaders/gemm_tiled.glsl, workgroup tiles through shared memory (GPUs). cooperative_matrix:
// VK_KHR_cooperative_matrix (fp16 x fp16 -> fp32); chosen only once a kernel of that kind has
// been checked on a GPU that offers it (none has yet: gemm_tiles never returns it).
enum class GemmKind { registers, shared_memory, cooperative_matrix };

// registers: `group` invocations per workgroup, each computing `rows` x `columns` outputs; with
// share_columns (group is one subgroup, columns a multiple of it) each invocation loads 1/group
// of the shared B row and shuffles the rest in.
// shared_memory: `group` invocations compute a block_rows x block_columns block, each `rows` x
// `columns` outputs of it, taking `depth` reduction steps at a time through shared memory.
struct GemmTiles {
  int32_t group, rows, columns;
  bool share_columns;
  int32_t reduction_unroll;  // reduction steps loaded ahead of their FMAs
  GemmKind kind = GemmKind::registers;
  int32_t block_rows = 0, block_columns = 0, depth = 0;
  // registers: where record_gemm's operands are contiguous along m or k (A) and k (B), in
  // multiples of 4 (shaders/gemm_quads.comp), a subgroup's lanes each own quad_rows rows (a
  // multiple of 4) and share quad_columns columns (at most group), loading quad_steps reduction
  // steps ahead of their FMAs; 0 where the device has none (GPUs).
  int32_t quad_rows = 0, quad_columns = 0, quad_steps = 0;

  // The outputs of one workgroup: rows_per_group() x columns_per_group().
  int32_t rows_per_group() const { return kind == GemmKind::registers ? group * rows : block_rows; }
  int32_t columns_per_group() const { return kind == GemmKind::registers ? columns : block_columns; }
  // shared_memory: the bytes of shared memory its kernels declare.
  uint32_t shared_bytes() const;
  // shared_memory: specialization constants 0..5 of shaders/gemm_tiled.glsl.
  std::vector<int32_t> tiled_constants() const;
};
// The variant and tiles for a product with M rows on `target`, from the device's properties
// alone. CPU-like devices (TileTarget::cpu_like) get register blocks (large per invocation,
// since loads cost far more than FMAs there). GPUs get shared-memory tiles: 256 invocations (a
// whole number of subgroups) within the workgroup limits, each computing 4x4 outputs (so that
// they keep within the registers a GPU gives such a workgroup), the deepest block whose tiles
// fit half the shared memory (so that two workgroups share a core). Fewer rows per
// invocation where M is too small to fill a block (a 3-channel image), rounded up to a power of
// two so that few pipelines are built. The GEMM-shaped ops record with the tiles of
// kernels.tile_target().
GemmTiles gemm_tiles(const vk::TileTarget& target, int64_t M);

// Element (row, col) of a strided matrix is at row * row_stride + col * col_stride.
struct MatrixView;
// Whether record_gemm reads c = a b through texels of four elements (shaders/gemm_quads.comp:
// on lavapipe one 16-byte load a lane instead of an 8-lane gather): tiles with quad_rows, B
// contiguous along k, A along m or k, their other strides and K multiples of 4, every texel
// within its tensor. record_gemm asks it after choosing between C and C^T (a row-major product
// becomes C^T = B^T A^T, A along m and B along k).
bool quad_texels_apply(const GemmTiles& tiles, uint32_t M, uint32_t N, uint32_t K, const MatrixView& a,
                       const MatrixView& b);

// Workgroups (y, z) that count `blocks` column blocks without passing the y limit.
std::pair<uint32_t, uint32_t> column_groups(uint64_t blocks);

// first, count: a window of the tensor's elements, bound as the operand's start (vk::window:
// first a multiple of 256 bytes); count 0: the whole tensor.
struct MatrixView {
  const Tensor* tensor;
  uint32_t row_stride, col_stride;
  uint64_t first = 0, count = 0;
  uint64_t elements() const { return count ? count : static_cast<uint64_t>(tensor->count()); }
};

// c[M,N] (+)= a[M,K] b[K,N] (+ bias[m] for each row m, where bias is given), then the epilogue
// (not with accumulate; its scale is per row m, its residual laid out as c; no folded batch
// norm: that is conv2d's). Any operand may be fp16; sums are float. An operand may be a window
// of its tensor (MatrixView::count), the output too where the epilogue adds no residual.
void record_gemm(vk::Recorder& recorder, vk::Kernels& kernels, uint32_t M, uint32_t N, uint32_t K,
                 MatrixView a, MatrixView b, MatrixView c, bool accumulate, const Tensor* bias = nullptr,
                 const Epilogue& epilogue = {});

// The specialization constants of shaders/epilogue.glsl (ACTIVATION, HAS_SCALE, RESIDUAL) for
// `epilogue`, after `constants`.
std::vector<int32_t> with_epilogue_constants(std::vector<int32_t> constants, const Epilogue& epilogue);
// Its scale and its residual, as epilogue.glsl binds them; `stand_in` (a tensor the dispatch
// reads anyway) where it has none. A residual of another type than `output` is a logic_error:
// the kernel reads it in its output's precision.
vk::BufferArg epilogue_scale_arg(const Epilogue& epilogue, const Tensor& stand_in);
vk::BufferArg epilogue_residual_arg(const Epilogue& epilogue, const Tensor& stand_in, const Tensor& output);

struct FoldedBatchNorm;
// blocked[kb, r, u] = weight[r, kb * block + u] for weight [rows, columns], zero past the columns
// (shaders/conv2d_forward_weight.comp), each row scaled by gamma / sqrt(var + eps) of a folded
// batch norm where `fold` is given: what conv2d's forward and, with a block of one (then the
// transpose W^T [columns, rows]), an inference linear layer's read.
void record_blocked_weight(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& weight, const Tensor& blocked,
                           uint32_t rows, uint32_t columns, int32_t block, const FoldedBatchNorm* fold = nullptr);

// dbias[o] += sum_{n,i} dy[n,o,i] for dy [batch, channels, pixels].
void record_bias_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& dy,
                          const Tensor& dbias, uint32_t batch, uint32_t channels, uint32_t pixels);

}  // namespace tessera
