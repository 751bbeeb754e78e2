// --device-memory-limit bounds the device memory tessera takes (pool blocks), not only the
// bytes of live buffers in them.
#include <gtest/gtest.h>

#include "common/error.h"
#include "compute/vk/memory.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

TEST(MemoryBudget, BlocksTakenStayWithinTheLimit) {
  auto& allocator = test::context().allocator();
  const uint64_t budget = 1 << 20;
  allocator.set_budget(budget);
  std::vector<vk::Buffer> buffers;
  for (int i = 0; i < 3; ++i) buffers.push_back(allocator.allocate(256 << 10, vk::MemoryUsage::device, "quarter"));
  EXPECT_EQ(allocator.stats().live_bytes, 3u * (256 << 10));
  EXPECT_LE(allocator.stats().reserved_bytes, budget);
  // A buffer that fits the live bytes of the budget but not the blocks left is refused too.
  EXPECT_THROW(allocator.allocate(512 << 10, vk::MemoryUsage::device, "half"), OutOfDeviceMemory);
  EXPECT_LE(allocator.stats().reserved_bytes, budget);
  // Freed ranges are reused within the blocks already taken.
  buffers.pop_back();
  buffers.push_back(allocator.allocate(256 << 10, vk::MemoryUsage::device, "quarter again"));
  EXPECT_LE(allocator.stats().reserved_bytes, budget);
}

TEST(MemoryBudget, OneBufferOverTheLimitIsRefused) {
  auto& allocator = test::context().allocator();
  allocator.set_budget(1 << 20);
  uint64_t before = allocator.stats().reserved_bytes;
  EXPECT_THROW(allocator.allocate((1 << 20) + 4096, vk::MemoryUsage::device, "too big"), OutOfDeviceMemory);
  EXPECT_EQ(allocator.stats().reserved_bytes, before);
}

TEST(MemoryBudget, TransfersNeedStagingOnlyWithoutMappedDeviceMemory) {
  auto& context = test::context();
  bool mapped = context.info().heaps.size() == 1;
  EXPECT_EQ(context.allocator().transfer_footprint(1000), mapped ? 0 : context.allocator().footprint(1000));
}

}  // namespace
}  // namespace tessera
