// What the kernels that reduce over a MIL bag's rows share (shaders/bag_rows.glsl): a workgroup
// for every kBagColumns neighbouring columns (features, classes) of the output.
#pragma once
#include <cstdint>

namespace tessera {

constexpr uint32_t kBagColumns = 16;  // bag_rows.glsl's BAG_LANES

// Workgroups for `columns` outputs, kBagColumns a workgroup.
inline uint32_t bag_column_groups(int64_t columns) {
  return static_cast<uint32_t>((columns + kBagColumns - 1) / kBagColumns);
}

}  // namespace tessera
