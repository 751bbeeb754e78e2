#include "tests/support/vulkan_environment.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>

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

std::vector<vk::TileTarget> runnable_tile_targets(vk::Context& context) {
  vk::TileTarget own = context.kernels().tile_target();
  return {own, {own.device_type == "cpu" ? "discrete-gpu" : "cpu", own.subgroup_size}};
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
