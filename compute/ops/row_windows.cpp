#include "compute/ops/row_windows.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace tessera {

std::vector<RowWindow> row_windows(const vk::TileTarget& target, const Tensor& tensor, int64_t rows,
                                   std::initializer_list<int64_t> row_bytes) {
  if (tensor.bytes() <= target.largest_binding) return {{0, static_cast<uint32_t>(rows)}};
  int64_t step = 1, widest = 1;
  for (int64_t bytes : row_bytes) {
    step = std::lcm(step, 256 / std::gcd(int64_t{256}, bytes));
    widest = std::max(widest, bytes);
  }
  const int64_t fit = static_cast<int64_t>(target.largest_binding) / widest / step * step;
  if (fit == 0) throw std::logic_error("not one aligned window of a tensor's rows fits a binding");
  std::vector<RowWindow> windows;
  for (int64_t first = 0; first < rows; first += fit)
    windows.push_back({static_cast<uint32_t>(first), static_cast<uint32_t>(std::min(fit, rows - first))});
  return windows;
}

std::vector<RowWindow> row_windows(const vk::TileTarget& target, const Tensor& tensor, int64_t rows) {
  return row_windows(target, tensor, rows, {static_cast<int64_t>(tensor.bytes()) / rows});
}

vk::BufferArg reads_rows(const Tensor& tensor, int64_t rows, const RowWindow& window) {
  if (window.first == 0 && window.rows == rows) return reads(tensor);
  const uint64_t row_bytes = tensor.bytes() / static_cast<uint64_t>(rows);
  return vk::window(reads(tensor), window.first * row_bytes, window.rows * row_bytes);
}

}  // namespace tessera
