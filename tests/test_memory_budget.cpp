// --device-memory-limit bounds the device memory tessera takes (pool blocks), not only the
// bytes of live buffers in them.
#include <gtest/gtest.h>

#include "common/error.h"
#include "compute/network.h"
#include "compute/trainer.h"
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

// One heap (lavapipe): device memory is mapped, so transfers need no staging, and staging
// buffers (the loop's inputs) are device memory. Two (a discrete GPU, or lavapipe under the
// discrete-gpu test layer): staging is the host's memory, which the device budget leaves out.
TEST(MemoryBudget, StagingTakesDeviceMemoryOnlyWithOneHeap) {
  auto& allocator = test::context().allocator();
  bool one_heap = test::context().info().heaps.size() == 1;
  EXPECT_EQ(allocator.transfer_footprint(1000), 0u);
  EXPECT_EQ(allocator.device_footprint(1000, vk::MemoryUsage::staging), one_heap ? allocator.footprint(1000) : 0);
  EXPECT_EQ(allocator.device_footprint(1000, vk::MemoryUsage::device), allocator.footprint(1000));
  uint64_t live = allocator.stats().live_bytes;
  vk::Buffer staging = allocator.allocate(1000, vk::MemoryUsage::staging, "staging");
  EXPECT_EQ(allocator.stats().live_bytes - live, one_heap ? allocator.footprint(1000) : 0);
}

// A linear layer of 2560 -> 4096 in training: a 40 MiB weight and its 40 MiB gradient. The
// gradient does not fit the 24 MiB left in the weight's 64 MiB block, so the allocator takes a
// second block: 80 MiB of buffers take 128 MiB of device memory, and the plan must say so.
TEST(MemoryBudget, PlanCountsTheRestOfABlockThatTheNextBufferDidNotFit) {
  nlohmann::json graph = {{"layers", {{{"name", "fc"}, {"type", "linear"}, {"out_features", 4096}}}}};
  const Shape input{2, 2560};
  const uint64_t MiB = 1 << 20;
  {
    vk::Context context;  // an allocator that holds nothing yet
    Network network(graph, input, true);
    MemoryPlan plan = network.plan(context.allocator());
    uint64_t planned = plan.device_bytes(context.allocator());
    EXPECT_GE(plan.total(), 80 * MiB);
    EXPECT_LT(plan.total(), 81 * MiB);
    EXPECT_GE(planned, plan.total() + 24 * MiB);  // the rest of the first block counts
    network.allocate(context);
    uint64_t taken = context.allocator().stats().reserved_bytes;
    EXPECT_GE(taken, plan.total() + 24 * MiB);
    EXPECT_LE(taken, planned);
    EXPECT_GE(static_cast<double>(taken), 0.99 * static_cast<double>(planned));
    EXPECT_EQ(context.validation_messages(), 0u);
  }
  {
    // A budget over the buffers' bytes but under the blocks: the plan does not fit, and neither
    // does the allocation.
    vk::Context context;
    context.allocator().set_budget(100 * MiB);
    Network network(graph, input, true);
    MemoryPlan plan = network.plan(context.allocator());
    EXPECT_LE(plan.total(), 100 * MiB);
    EXPECT_GT(plan.device_bytes(context.allocator()), 100 * MiB);
    EXPECT_THROW(network.allocate(context), OutOfDeviceMemory);
    EXPECT_LE(context.allocator().stats().reserved_bytes, 100 * MiB);
    EXPECT_EQ(context.validation_messages(), 0u);
  }
}

// The plan starts from what the allocator holds: room left in its blocks takes planned buffers.
TEST(MemoryBudget, PlanPlacesBuffersInTheRoomLeftInBlocks) {
  vk::Context context;
  auto& allocator = context.allocator();
  vk::Buffer held = allocator.allocate(1 << 20, vk::MemoryUsage::device, "held");
  uint64_t before = allocator.stats().reserved_bytes;
  EXPECT_EQ(allocator.reserved_after({{4 << 20, vk::MemoryUsage::device}}), before);
  std::vector<vk::PlannedBuffer> planned{{40u << 20, vk::MemoryUsage::device}, {40u << 20, vk::MemoryUsage::device}};
  uint64_t expected = allocator.reserved_after(planned);
  EXPECT_GT(expected, before);
  std::vector<vk::Buffer> buffers;
  for (auto& buffer : planned) buffers.push_back(allocator.allocate(buffer.bytes, buffer.usage, "planned"));
  EXPECT_EQ(allocator.stats().reserved_bytes, expected);
  EXPECT_EQ(context.validation_messages(), 0u);
}

// Every byte a plan reports is in the buffer list that the budget check places: a data-parallel
// plan counts the whole micro-batch the Feed writes before the replicas take their parts
// (it once added those bytes to its categories only, and they escaped the budget).
TEST(MemoryBudget, ReplicatedPlanPlacesItsWholeBatchStaging) {
  vk::ContextOptions options = vk::options_from_environment();
  options.device_index = 0;
  vk::Context first(options), second(options);  // one device opened twice: two replicas
  LoopSettings settings;
  settings.accumulate = 2;
  TrainingJob job;
  job.model = load_model_description("small-cnn", 2, 8);
  job.graph = job.model;
  job.prologue = nlohmann::json::array({{{"name", "input"}, {"type", "input_normalize"}, {"inputs", {"images"}}}});
  const int64_t batch = 10;  // 5 samples each, so the two replicas plan alike
  job.staged = {{"images", {batch, 32, 32, 3}, DType::u8}, {"labels", {batch}, DType::u32}, {"valid", {1}, DType::u32}};
  TrainingLoop loop({&first, &second}, settings, job);
  std::vector<MemoryPlan> plans = loop.plans();
  ASSERT_EQ(plans.size(), 2u);
  for (size_t d = 0; d < plans.size(); ++d) {
    uint64_t placed = 0;
    for (auto& buffer : plans[d].buffers) placed += first.allocator().device_footprint(buffer.bytes, buffer.usage);
    EXPECT_EQ(placed, plans[d].total()) << "device " << d;
  }
  // The first device also holds the whole micro-batch: images, labels and the valid count (staging:
  // host memory on a discrete GPU, which the plan does not count).
  auto staged = [&](uint64_t bytes) { return first.allocator().device_footprint(bytes, vk::MemoryUsage::staging); };
  uint64_t whole = staged(batch * 32 * 32 * 3) + staged(batch * 4) + staged(4);
  EXPECT_EQ(plans[0].total(), plans[1].total() + whole);
  EXPECT_EQ(first.validation_messages() + second.validation_messages(), 0u);
}

}  // namespace
}  // namespace tessera
