#include "tests/support/vulkan_environment.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <utility>

#include "compute/op.h"
#include "compute/ops/gemm.h"

namespace tessera::test {

namespace {
std::unique_ptr<vk::Context> shared_context;

class ValidationCheck : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!shared_context) return;
    uint64_t messages = shared_context->validation_messages();
    shared_context.reset();
    EXPECT_EQ(messages, 0u) << "the Vulkan validation layer reported " << messages << " messages";
  }
};
}  // namespace

vk::Context& context() {
  if (!shared_context) shared_context = std::make_unique<vk::Context>();
  return *shared_context;
}

std::vector<ReferenceDevice> reference_devices() {
  // type, subgroup size, maxComputeSharedMemorySize, maxComputeWorkGroupInvocations,
  // maxComputeWorkGroupSize[0], subgroup arithmetic, VK_KHR_cooperative_matrix
  return {
      {"NVIDIA H100 (NVIDIA driver)", {"discrete-gpu", 32, 49152, 1024, 1024, true, true}},
      {"AMD RDNA3, wave64 (RADV)", {"discrete-gpu", 64, 65536, 1024, 1024, true, true}},
      {"AMD RDNA2, wave32", {"discrete-gpu", 32, 65536, 1024, 1024, true, false}},
      {"Intel Xe (ANV)", {"integrated-gpu", 32, 65536, 1024, 1024, true, false}},
      {"Apple M1 (MoltenVK)", {"integrated-gpu", 32, 32768, 1024, 1024, true, false}},
      {"lavapipe", {"cpu", 8, 32768, 1024, 1024, true, false}},
      {"lavapipe presented as a discrete GPU", {"discrete-gpu", 8, 32768, 1024, 1024, true, false}},
      {"Vulkan's minimum limits, subgroups of 32", {"other", 32, 16384, 128, 128, false, false}},
  };
}

namespace {
// What distinguishes two targets' kernels: the variant and tiles for a large product, and the reductions.
std::vector<int32_t> variant_key(const vk::TileTarget& target) {
  GemmTiles tiles = gemm_tiles(target, 1 << 20);
  return {static_cast<int32_t>(tiles.kind), tiles.group, tiles.rows, tiles.columns, tiles.share_columns ? 1 : 0,
          tiles.reduction_unroll, tiles.block_rows, tiles.block_columns, tiles.depth, subgroup_reductions(target) ? 1 : 0};
}
}  // namespace

std::vector<vk::TileTarget> runnable_tile_targets(vk::Context& context) {
  vk::TileTarget own = context.kernels().tile_target();
  std::vector<vk::TileTarget> candidates{own};
  // lavapipe presented as a discrete GPU (tests/support/discrete_gpu, tools/run-tests.sh): the
  // other targets' kernels are those the plain run checked on this same device, so only its own
  // target, with the discrete GPU's transfers, is new here (the ops' tests in half the time).
  if (context.info().host_cores && context.info().type == "discrete-gpu") return candidates;
  for (const ReferenceDevice& device : reference_devices()) {
    vk::TileTarget target = device.target;
    if (target.device_type == "cpu") target.subgroup_size = own.subgroup_size;  // one subgroup per workgroup
    target.subgroup_arithmetic = target.subgroup_arithmetic && own.subgroup_arithmetic;
    candidates.push_back(target);
  }
  std::vector<vk::TileTarget> targets;
  std::set<std::vector<int32_t>> seen;
  for (const vk::TileTarget& target : candidates) {
    GemmTiles tiles = gemm_tiles(target, 1 << 20);
    bool fits = tiles.kind == GemmKind::registers
                    ? target.subgroup_size == own.subgroup_size
                    : tiles.shared_bytes() <= own.max_shared_memory &&
                          static_cast<uint32_t>(tiles.group) <= own.max_workgroup_invocations &&
                          static_cast<uint32_t>(tiles.group) <= own.max_workgroup_size_x;
    if (fits && seen.insert(variant_key(target)).second) targets.push_back(target);
  }
  return targets;
}

std::string describe(const vk::TileTarget& target) {
  GemmTiles tiles = gemm_tiles(target, 1 << 20);
  std::string text = target.device_type + ", subgroup " + std::to_string(target.subgroup_size) + ", " +
                     std::to_string(target.max_shared_memory) + " B shared: ";
  if (tiles.kind == GemmKind::registers)
    text += "register blocks " + std::to_string(tiles.rows) + "x" + std::to_string(tiles.columns) + " over " +
            std::to_string(tiles.group) + " invocations";
  else
    text += "shared-memory tiles " + std::to_string(tiles.block_rows) + "x" + std::to_string(tiles.block_columns) +
            "x" + std::to_string(tiles.depth) + " over " + std::to_string(tiles.group) + " invocations";
  return text + (subgroup_reductions(target) ? ", subgroup reductions" : ", shared-memory reductions");
}

std::vector<vk::TileTarget> reduction_targets(vk::Context& context) {
  vk::TileTarget own = context.kernels().tile_target(), other = own;
  if (subgroup_reductions(own)) {
    other.subgroup_arithmetic = false;
  } else {
    if (!own.subgroup_arithmetic) return {own};
    other.device_type = "discrete-gpu";  // as a GPU with subgroups of 32 gets them
    other.subgroup_size = 32;
  }
  return {own, other};
}

vk::TileTarget binding_at_most(vk::Context& context, uint64_t bytes) {
  vk::TileTarget target = context.kernels().tile_target();
  target.largest_binding = bytes;
  return target;
}

TileTargetScope::TileTargetScope(vk::Context& context, vk::TileTarget target)
    : kernels_(context.kernels()), before_(kernels_.tile_target()) {
  kernels_.set_tile_target(std::move(target));
}

TileTargetScope::~TileTargetScope() { kernels_.set_tile_target(before_); }

}  // namespace tessera::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new tessera::test::ValidationCheck);
  return RUN_ALL_TESTS();
}
