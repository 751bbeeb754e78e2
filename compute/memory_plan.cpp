#include "compute/memory_plan.h"

#include "common/error.h"
#include "common/units.h"

namespace tessera {

void MemoryPlan::add(const vk::Allocator& allocator, const std::string& category, uint64_t size,
                     vk::MemoryUsage usage, const std::string& name, bool windowed) {
  bytes[category] += allocator.device_footprint(size, usage);
  buffers.push_back({size, usage, name.empty() ? category : name, windowed});
}

void MemoryPlan::append(const MemoryPlan& other) {
  for (auto& [category, size] : other.bytes) bytes[category] += size;
  buffers.insert(buffers.end(), other.buffers.begin(), other.buffers.end());
}

uint64_t MemoryPlan::total() const {
  uint64_t sum = 0;
  for (auto& [category, size] : bytes) sum += size;
  return sum;
}

const vk::PlannedBuffer* MemoryPlan::oversized(const vk::DeviceInfo& device) const {
  for (const vk::PlannedBuffer& buffer : buffers)
    if (buffer.bytes > device.largest_buffer && !buffer.windowed) return &buffer;
  return nullptr;
}

bool MemoryPlan::fits(vk::Context& context) const {
  return !oversized(context.info()) && device_bytes(context.allocator()) <= context.allocator().stats().budget_bytes;
}

void check_plan_fits(vk::Context& context, const MemoryPlan& plan, const std::string& advice) {
  if (const vk::PlannedBuffer* buffer = plan.oversized(context.info()))
    throw OutOfDeviceMemory("the run needs a buffer of " + format_bytes(buffer->bytes) + " for " + buffer->name +
                            ", over the largest that " + context.info().name + " binds (" +
                            format_bytes(context.info().largest_buffer) + ") (" + advice + ")");
  const vk::Allocator& allocator = context.allocator();
  uint64_t budget = allocator.stats().budget_bytes;
  uint64_t in_use = allocator.stats().live_bytes;
  // The blocks the allocator will hold bound the run, not only the buffers' bytes.
  if (uint64_t device_bytes = plan.device_bytes(allocator); device_bytes > budget)
    throw OutOfDeviceMemory("the run needs " + format_bytes(plan.total()) + " of device memory, " +
                            format_bytes(device_bytes) + " in the allocator's blocks" +
                            (in_use ? " with " + format_bytes(in_use) + " already in use" : std::string()) +
                            (context.info().name.empty() ? std::string() : " on " + context.info().name) +
                            "; the budget is " + format_bytes(budget) + " (" + advice + ")");
}

}  // namespace tessera
