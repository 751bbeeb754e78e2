// Windows of rows of a tensor past what one binding reaches (TileTarget::largest_binding): a bag's
// features, which the ops that read them (linear, the MIL pools) bind a window at a time
// (vk::window), so that a graph input read by such ops alone may pass the binding.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "compute/tensor.h"
#include "compute/vk/kernels.h"

namespace tessera {

// Rows [first, first + rows).
struct RowWindow {
  uint32_t first, rows;
};

// All `rows` at once where `tensor` fits one binding; else windows of as many rows as fit
// (the widest of `row_bytes`, each a tensor read or written by rows), every window's start
// 256-byte aligned in each of them.
std::vector<RowWindow> row_windows(const vk::TileTarget& target, const Tensor& tensor, int64_t rows,
                                   std::initializer_list<int64_t> row_bytes);

// A tensor of `rows` rows that a kernel alone reads: its windows, and the binding that reads
// one of them as the kernel's start.
std::vector<RowWindow> row_windows(const vk::TileTarget& target, const Tensor& tensor, int64_t rows);
vk::BufferArg reads_rows(const Tensor& tensor, int64_t rows, const RowWindow& window);

}  // namespace tessera
