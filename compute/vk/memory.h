// Device memory: buffers sub-allocated from pooled blocks, with a budget and peak accounting.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tessera::vk {

class Context;
class Allocator;

enum class MemoryUsage {
  device,   // tensors: device-local, host-visible only where the device has one heap (lavapipe, UMA)
  staging,  // host-visible and coherent: uploads and read-backs
};

// A VkBuffer bound to a range of a pooled block. Move-only; returns its range when destroyed.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  VkBuffer handle() const { return handle_; }
  // The buffer as float texels (R32_SFLOAT, or R16_SFLOAT for half-precision contents) for
  // kernels that read it as a samplerBuffer, or VK_NULL_HANDLE for a buffer under one texel.
  // CPU devices gather texels with vector loads but storage buffers lane by lane, so
  // read-mostly operands go this way; either format reads as float in the shader.
  VkBufferView texel_view(bool half = false) const { return half ? half_texel_view_ : texel_view_; }
  uint64_t size() const { return size_; }
  // Host address of the contents, or nullptr when the memory is not host-visible.
  void* mapped() const { return mapped_; }
  explicit operator bool() const { return handle_ != VK_NULL_HANDLE; }

 private:
  friend class Allocator;
  void release();

  Allocator* owner_ = nullptr;
  VkBuffer handle_ = VK_NULL_HANDLE;
  VkBufferView texel_view_ = VK_NULL_HANDLE, half_texel_view_ = VK_NULL_HANDLE;
  uint64_t size_ = 0;
  void* mapped_ = nullptr;
  uint32_t pool_ = 0, block_ = 0;
  uint64_t offset_ = 0, reserved_ = 0;
};

struct MemoryStats {
  uint64_t live_bytes = 0;      // bytes held by live buffers (aligned sizes)
  uint64_t peak_bytes = 0;      // the most live_bytes ever reached
  uint64_t reserved_bytes = 0;  // bytes of the device memory blocks behind them: what the budget bounds
  uint64_t budget_bytes = 0;
  uint64_t allocations = 0;
};

class Allocator {
 public:
  // budget 0: the size of the largest device-local heap.
  Allocator(Context& context, uint64_t budget);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Throws OutOfDeviceMemory (exit 3) naming `what`, the bytes asked for and the budget.
  Buffer allocate(uint64_t bytes, MemoryUsage usage, const std::string& what);
  const MemoryStats& stats() const { return stats_; }
  void set_budget(uint64_t bytes) { stats_.budget_bytes = bytes; }
  // Returns empty blocks to the driver.
  void trim();
  // The bytes a buffer of `bytes` takes in a block once aligned (for memory plans).
  uint64_t footprint(uint64_t bytes) const;
  // The staging buffer that uploading or downloading a tensor of `bytes` takes: none where
  // device memory is mapped (lavapipe, integrated GPUs), its footprint on discrete GPUs.
  uint64_t transfer_footprint(uint64_t bytes) const;

 private:
  friend class Buffer;
  struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    uint64_t size = 0;
    void* mapped = nullptr;
    std::map<uint64_t, uint64_t> free;  // offset -> size, coalesced
    uint64_t used = 0;
  };
  struct Pool {
    uint32_t memory_type = 0;
    bool host_visible = false;
    std::vector<std::unique_ptr<Block>> blocks;
  };
  void free(Buffer& buffer);
  uint32_t pool_for(MemoryUsage usage, uint32_t type_bits);

  Context& context_;
  std::vector<Pool> pools_;
  MemoryStats stats_;
  uint64_t alignment_ = 256;
  bool device_memory_mapped_ = false;
};

}  // namespace tessera::vk
