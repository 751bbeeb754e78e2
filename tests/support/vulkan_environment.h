// One Vulkan context shared by the tests of an executable; the run fails if the validation
// layer reported anything.
#pragma once
#include <vector>

#include "compute/vk/context.h"
#include "compute/vk/kernels.h"

namespace tessera::test {

vk::Context& context();

// The tile targets (compute/ops/gemm.h) whose shapes run on `context`'s device: its own, and the
// other branch of the choice with the device's subgroup size (a CPU device runs a GPU's shapes,
// which use no subgroup operations; a GPU runs a CPU's, one subgroup per workgroup).
std::vector<vk::TileTarget> runnable_tile_targets(vk::Context& context);

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
