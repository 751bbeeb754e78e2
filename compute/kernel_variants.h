// Which kernel variants a device gets, from its properties alone, as the ops choose them
// (ops/gemm.h's gemm_tiles, op.h's subgroup_reductions, ops/layer_norm.h's row_group): what
// `tessera doctor` reports for each device, without building a kernel.
#pragma once
#include <nlohmann/json.hpp>

#include "compute/vk/kernels.h"

namespace tessera {

// {"gemm": {kind, workgroup, outputs per invocation, block, depth, shared bytes, why, and on CPU
//  devices quad_texels: {rows_per_lane, columns, steps_ahead, why}},
//  "reductions": {kind, why}, "layer_norm": {workgroup, subgroup_sum},
//  "cooperative_matrix": {offered, used, why}}, for a product of many rows (a ViT's or a ResNet's
// wide layers: 1024), the shape most of the work runs at.
nlohmann::json kernel_variants(const vk::TileTarget& target);

}  // namespace tessera
