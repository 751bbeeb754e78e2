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
  staging,  // host-visible, cached where the device has such memory (the host reads it back), and
            // then possibly not coherent: see Buffer::flush and Buffer::invalidate
  host,     // the host's own memory, which the device reads and copies from (streamed weights):
            // imported (VK_EXT_external_memory_host) where the device can, so that it takes none of
            // the device's heap even where that heap is the host's memory (lavapipe); else staging
};

// The texels of a Buffer's view: 32- or 16-bit floats, one a texel or four (quads).
struct TexelLayout {
  bool half = false, quads = false;
};
// R32_SFLOAT, R16_SFLOAT, R32G32B32A32_SFLOAT or R16G16B16A16_SFLOAT.
VkFormat texel_format(TexelLayout texels);

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
  // read-mostly operands go this way; either format reads as float in the shader. quads: four
  // floats a texel (R32G32B32A32_SFLOAT, R16G16B16A16_SFLOAT), which a CPU device loads with one
  // 16-byte load a lane instead of a gather (shaders/gemm_quads.comp).
  VkBufferView texel_view(bool half = false, bool quads = false) const {
    return quads ? (half ? half_quad_view_ : quad_view_) : half ? half_texel_view_ : texel_view_;
  }
  // texel_view of `bytes` from `offset` on (a window of a buffer past what one binding reaches:
  // Allocator::allocate's `windowed`), made on first use and kept with the buffer.
  VkBufferView window_view(uint64_t offset, uint64_t bytes, bool half, bool quads) const;
  uint64_t size() const { return size_; }
  // Host address of the contents, or nullptr when the memory is not host-visible.
  void* mapped() const { return mapped_; }
  // Where the mapped memory is not coherent (cached host memory of some GPUs), what the host wrote
  // reaches the device only once flushed, and what the device wrote reaches the host only once
  // invalidated (after the device's work has finished); on coherent memory both do nothing. They
  // act on whole nonCoherentAtomSize atoms, which never reach another buffer (the allocator
  // aligns buffers to them). An invalidate drops the host's unflushed writes in its range.
  void flush(uint64_t offset = 0, uint64_t bytes = VK_WHOLE_SIZE) const;
  void invalidate(uint64_t offset = 0, uint64_t bytes = VK_WHOLE_SIZE) const;
  // Copies into the mapping and flushes; invalidates and copies out of it.
  void write(const void* data, uint64_t bytes, uint64_t offset = 0) const;
  void read(void* data, uint64_t bytes, uint64_t offset = 0) const;
  explicit operator bool() const { return handle_ != VK_NULL_HANDLE; }

 private:
  friend class Allocator;
  void release();

  Allocator* owner_ = nullptr;
  VkBuffer handle_ = VK_NULL_HANDLE;
  VkBufferView texel_view_ = VK_NULL_HANDLE, half_texel_view_ = VK_NULL_HANDLE;
  VkBufferView quad_view_ = VK_NULL_HANDLE, half_quad_view_ = VK_NULL_HANDLE;
  struct WindowView {
    uint64_t offset, bytes;
    bool half, quads;
    VkBufferView view;
  };
  mutable std::vector<WindowView> window_views_;
  uint64_t size_ = 0;
  void* mapped_ = nullptr;
  uint32_t pool_ = 0, block_ = 0;
  uint64_t offset_ = 0, reserved_ = 0;
};

// A buffer a run will allocate, for Allocator::reserved_after.
struct PlannedBuffer {
  uint64_t bytes;
  MemoryUsage usage;
  std::string name = {};  // what it holds, for a message (a tensor's name, else its category)
  bool windowed = false;  // every kernel binds it in windows (Allocator::allocate)
};

// Of the device's own memory (its device-local heap): host memory that a discrete GPU's staging
// buffers take is not counted, and the budget does not bound it.
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

  // Throws a runtime Error naming the device and format where one of the four texel formats
  // cannot back both uniform and storage texel buffers (Vulkan makes all but R16 mandatory;
  // lavapipe offers it).
  // Throws OutOfDeviceMemory (exit 3) naming `what`, the bytes asked for and the budget.
  // windowed: every kernel binds the buffer in windows (vk::window), so it may pass the largest
  // buffer one binding reaches.
  Buffer allocate(uint64_t bytes, MemoryUsage usage, const std::string& what, bool windowed = false);
  // A texel view of `bytes` of `buffer` from `offset` on (Buffer::window_view).
  VkBufferView make_window_view(const Buffer& buffer, uint64_t offset, uint64_t bytes, bool half, bool quads) const;
  const MemoryStats& stats() const { return stats_; }
  void set_budget(uint64_t bytes) { stats_.budget_bytes = bytes; }
  // Returns empty blocks to the driver.
  void trim();
  // The bytes a buffer of `bytes` takes in a block once aligned (for memory plans).
  uint64_t footprint(uint64_t bytes) const;
  // Its footprint in the device's memory: none for staging in host memory (discrete GPUs).
  uint64_t device_footprint(uint64_t bytes, MemoryUsage usage) const;
  // The device memory that the staging buffer of an upload or download of a tensor of `bytes`
  // takes: none where device memory is mapped (lavapipe, integrated GPUs) or where staging
  // memory is the host's (discrete GPUs).
  uint64_t transfer_footprint(uint64_t bytes) const;
  // The device memory (blocks) this allocator would hold after allocating `buffers` in this
  // order on top of what it holds now: each placed as allocate() places it, so a buffer that
  // does not fit the rest of a block starts another and that rest counts. What a memory plan
  // checks against the budget (a buffer over the budget counts the block it would take).
  uint64_t reserved_after(const std::vector<PlannedBuffer>& buffers) const;

 private:
  friend class Buffer;
  struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    uint64_t size = 0;
    void* mapped = nullptr;
    std::map<uint64_t, uint64_t> free;  // offset -> size, coalesced
    uint64_t used = 0;
    void* host = nullptr;  // an imported block's host memory, which the allocator frees
  };
  struct Pool {
    uint32_t memory_type = 0;
    bool host_visible = false;
    bool coherent = true;
    bool device_heap = true;  // in the device's own memory: counted in stats_ and bounded by the budget
    bool imported = false;    // blocks of imported host memory, one buffer each (MemoryUsage::host)
    std::vector<std::unique_ptr<Block>> blocks;
  };
  // Where a buffer of `reserved` bytes goes: a block of the pool and the offset in it, where
  // `block` is the pool's size when it needs a new block (of new_block_size). allocate() and
  // reserved_after() both place buffers with it.
  struct Placement {
    size_t block;
    uint64_t offset;
  };
  static Placement place(const std::vector<std::unique_ptr<Block>>& blocks, uint64_t reserved, uint64_t alignment);
  // A new block for `reserved` bytes with `reserved_now` of blocks taken: kBlockSize cut to what
  // the budget has left, and never under `reserved`.
  uint64_t new_block_size(uint64_t reserved, uint64_t reserved_now) const;
  // Takes [offset, offset + reserved) out of the free range of `block` that holds it.
  static void carve(Block& block, uint64_t offset, uint64_t reserved);
  void free(Buffer& buffer);
  // Buffer::flush (flush true) and Buffer::invalidate.
  void sync_host(const Buffer& buffer, uint64_t offset, uint64_t bytes, bool flush) const;
  // MemoryUsage::host where the device imports host memory: a block of its own, over memory this
  // allocator takes from the host (aligned as the device asks) and gives back when it is freed.
  Buffer import_host(uint64_t bytes, const std::string& what);
  // The buffer's texel views (Buffer::texel_view).
  void make_views(Buffer& buffer, uint64_t bytes) const;
  uint32_t memory_type_for(MemoryUsage usage, uint32_t type_bits) const;
  bool in_device_heap(uint32_t memory_type) const;
  uint32_t pool_for(MemoryUsage usage, uint32_t type_bits);

  Context& context_;
  std::vector<Pool> pools_;
  MemoryStats stats_;
  uint64_t alignment_ = 256;
  uint64_t atom_ = 1;  // nonCoherentAtomSize
  uint32_t storage_type_bits_ = ~0u;  // the memory types a storage buffer may take
  bool device_memory_mapped_ = false;
  // MemoryUsage::host imports host memory (VK_EXT_external_memory_host), aligned to this.
  bool import_host_ = false;
  uint64_t import_alignment_ = 4096;
  PFN_vkGetMemoryHostPointerPropertiesEXT host_pointer_properties_ = nullptr;
  // TESSERA_FAULT=skip_flush (tests): flushes do nothing, as if tessera had forgotten them.
  bool skip_flush_ = false;
};

}  // namespace tessera::vk
