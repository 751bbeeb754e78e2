// The device memory a run will take, computed from shapes alone before anything is allocated,
// and the check of it against the device's budget that every command touching a device makes
// (docs/architecture.md, "Memory discipline").
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "compute/vk/context.h"
#include "compute/vk/memory.h"

namespace tessera {

// Per-category device bytes and every buffer, in the order the run allocates them.
struct MemoryPlan {
  std::map<std::string, uint64_t> bytes;   // "parameters", "gradients", "activations", ...
  std::vector<vk::PlannedBuffer> buffers;  // every buffer, in the order the run allocates it
  // Weight streaming (compute/weight_stream.h), where the pass streams: its groups of transformer
  // blocks, the ring's slots and the bytes of weights kept in host memory.
  struct Streaming {
    int groups = 0, blocks_per_group = 0, slots = 0;
    uint64_t streamed_bytes = 0;
  } streaming;
  // Training: copies of each staged micro-batch (Replica::set_staging_slots).
  int staging_slots = 0;
  // Adds a buffer of `bytes` (its footprint in device memory to `category`), named `name` (else
  // by its category); `windowed`: kernels bind it in windows (vk::Allocator::allocate).
  void add(const vk::Allocator& allocator, const std::string& category, uint64_t bytes,
           vk::MemoryUsage usage = vk::MemoryUsage::device, const std::string& name = {}, bool windowed = false);
  // Adds every buffer of `other` after these.
  void append(const MemoryPlan& other);
  // The bytes of the buffers.
  uint64_t total() const;
  // What the allocator will take from the device for them on top of what it holds: its blocks,
  // with the rest of a block that the next buffer did not fit (what the budget bounds).
  uint64_t device_bytes(const vk::Allocator& allocator) const { return allocator.reserved_after(buffers); }
  // The first buffer over the device's largest that kernels bind whole (lavapipe's 128 MiB
  // storage buffer range), or nullptr.
  const vk::PlannedBuffer* oversized(const vk::DeviceInfo& device) const;
  // Within the budget, and no buffer over the device's largest.
  bool fits(vk::Context& context) const;
};

// Throws OutOfDeviceMemory (exit 3) naming the plan's bytes, the blocks they take and the budget,
// with `advice` on what to change, when the plan and what is already allocated are over the
// budget, or naming the buffer that is over the device's largest. Every command calls it before
// it allocates.
void check_plan_fits(vk::Context& context, const MemoryPlan& plan, const std::string& advice);

}  // namespace tessera
