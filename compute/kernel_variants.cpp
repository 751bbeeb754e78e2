#include "compute/kernel_variants.h"

#include <string>

#include "compute/op.h"
#include "compute/ops/gemm.h"
#include "compute/ops/layer_norm.h"

namespace tessera {

namespace {
// The rows of a wide layer's product (ViT-L's width, ResNet-50's layer3 channels): enough to
// fill any block, so the tiles shown are the ones most of a model's work runs at.
constexpr int64_t kWideRows = 1024;

const char* gemm_kind_name(GemmKind kind) {
  switch (kind) {
    case GemmKind::registers: return "registers";
    case GemmKind::shared_memory: return "shared_memory";
    case GemmKind::cooperative_matrix: return "cooperative_matrix";
  }
  return "unknown";
}
}  // namespace

nlohmann::json kernel_variants(const vk::TileTarget& target) {
  const std::string lanes = std::to_string(target.subgroup_size);
  const std::string cpu_why =
      target.device_type == "cpu"
          ? std::string("a CPU device")
          : "subgroups of " + lanes + " lanes (at most 8: SIMD lanes of a CPU core, whatever type it reports)";
  GemmTiles tiles = gemm_tiles(target, kWideRows);
  nlohmann::json gemm = {{"kind", gemm_kind_name(tiles.kind)},
                         {"workgroup", tiles.group},
                         {"outputs_per_invocation", {tiles.rows, tiles.columns}}};
  if (tiles.kind == GemmKind::registers) {
    gemm["why"] = cpu_why + ": blocks kept in registers, no shared memory or barriers";
    gemm["quad_texels"] = {{"rows_per_lane", tiles.quad_rows},
                           {"columns", tiles.quad_columns},
                           {"steps_ahead", tiles.quad_steps},
                           {"why", "operands contiguous along m or k in multiples of 4: four-element texels, one "
                                   "16-byte load a lane instead of a gather"}};
  } else {
    gemm.update({{"block", {tiles.block_rows, tiles.block_columns}},
                 {"depth", tiles.depth},
                 {"shared_bytes", tiles.shared_bytes()},
                 {"why", "a GPU: workgroup tiles through shared memory, the largest within half of its " +
                             std::to_string(target.max_shared_memory) + " bytes"}});
  }
  const bool subgroup = subgroup_reductions(target);
  nlohmann::json reductions = {
      {"kind", subgroup ? "subgroup" : "shared_memory"},
      {"why", subgroup ? "subgroup arithmetic in compute shaders (subgroupAdd), on a GPU"
                       : target.cpu_like() ? cpu_why + ": a tree through shared memory, faster there"
                                           : std::string("no subgroup arithmetic in compute shaders: a tree through "
                                                         "shared memory")}};
  const uint32_t row_workgroup = row_group(target, kWideRows);
  nlohmann::json layer_norm = {{"workgroup", row_workgroup}, {"subgroup_sum", row_workgroup == target.subgroup_size}};
  nlohmann::json cooperative = {
      {"offered", target.cooperative_matrix},
      {"used", tiles.kind == GemmKind::cooperative_matrix},
      {"why", target.cooperative_matrix ? "offered, but no cooperative-matrix kernel has been checked on a GPU yet"
                                        : "VK_KHR_cooperative_matrix is not offered"}};
  return {{"gemm", gemm}, {"reductions", reductions}, {"layer_norm", layer_norm}, {"cooperative_matrix", cooperative}};
}

}  // namespace tessera
