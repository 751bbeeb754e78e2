// One Vulkan context shared by the tests of an executable; the run fails if the validation
// layer reported anything.
#pragma once
#include <string>
#include <vector>

#include "compute/vk/context.h"
#include "compute/vk/kernels.h"

namespace tessera::test {

vk::Context& context();

// The properties that kernel variants are chosen from (vk::TileTarget) of devices tessera is
// made for, as their drivers report them, for tests of that choice.
struct ReferenceDevice {
  std::string name;
  vk::TileTarget target;
};
std::vector<ReferenceDevice> reference_devices();

// The tile targets (compute/ops/gemm.h) whose kernel variants run on `context`'s device, each
// variant once: its own; a CPU device's register blocks with the device's subgroup size (a GPU
// runs them as one subgroup per workgroup); every reference device's shared-memory tiles that fit
// the device's limits (they use no subgroup operations). The reductions without subgroup
// arithmetic come with Vulkan's minimum limits. lavapipe presented as a discrete GPU: its own alone.
std::vector<vk::TileTarget> runnable_tile_targets(vk::Context& context);

// The device's own target and one with the other variant of the kernels that sum over a channel
// or a batch (op.h's subgroup_reductions): a GPU's subgroup sums on a CPU-like device that has
// subgroup arithmetic, the shared-memory tree on a GPU; the own alone without subgroup arithmetic.
std::vector<vk::TileTarget> reduction_targets(vk::Context& context);

// A target as tests name it: "discrete-gpu, subgroup 32, 49152 B shared: shared-memory tiles
// 128x128x16 over 256 invocations, subgroup reductions".
std::string describe(const vk::TileTarget& target);

// The device's own target, binding at most `bytes`: ops then read a larger input a window of
// rows at a time (compute/ops/row_windows.h).
vk::TileTarget binding_at_most(vk::Context& context, uint64_t bytes);

// While it lives, the ops of `context` record with the tile shapes of `target`.
class TileTargetScope {
 public:
  TileTargetScope(vk::Context& context, vk::TileTarget target);
  ~TileTargetScope();
  TileTargetScope(const TileTargetScope&) = delete;
  TileTargetScope& operator=(const TileTargetScope&) = delete;

 private:
  vk::Kernels& kernels_;
  vk::TileTarget before_;
};

}  // namespace tessera::test
