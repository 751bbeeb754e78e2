#include "compute/vk/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/error.h"
#include "common/units.h"
#include "compute/vk/context.h"

namespace tessera::vk {

namespace {
constexpr uint64_t kBlockSize = 64ull << 20;

constexpr VkBufferUsageFlags kBufferUsage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT |
                                            VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                            VK_BUFFER_USAGE_TRANSFER_DST_BIT;
constexpr TexelLayout kTexelLayouts[] = {{false, false}, {true, false}, {false, true}, {true, true}};
uint64_t texel_bytes(TexelLayout texels) { return (texels.half ? 2 : 4) * (texels.quads ? 4 : 1); }

uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// A buffer of `bytes` for every use tessera makes of one (`next`: its create info's chain), and
// the memory it needs.
VkBuffer create_buffer(VkDevice device, uint64_t bytes, const void* next, VkMemoryRequirements& requirements) {
  VkBufferCreateInfo create{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  create.pNext = next;
  create.size = std::max<uint64_t>(bytes, 4);
  create.usage = kBufferUsage;
  create.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  check(vkCreateBuffer(device, &create, nullptr, &buffer), "vkCreateBuffer");
  vkGetBufferMemoryRequirements(device, buffer, &requirements);
  return buffer;
}
}  // namespace

void Buffer::flush(uint64_t offset, uint64_t bytes) const {
  if (owner_) owner_->sync_host(*this, offset, bytes, true);
}

void Buffer::invalidate(uint64_t offset, uint64_t bytes) const {
  if (owner_) owner_->sync_host(*this, offset, bytes, false);
}

void Buffer::write(const void* data, uint64_t bytes, uint64_t offset) const {
  std::memcpy(static_cast<char*>(mapped_) + offset, data, bytes);
  flush(offset, bytes);
}

void Buffer::read(void* data, uint64_t bytes, uint64_t offset) const {
  invalidate(offset, bytes);
  std::memcpy(data, static_cast<const char*>(mapped_) + offset, bytes);
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    handle_ = std::exchange(other.handle_, VK_NULL_HANDLE);
    texel_view_ = std::exchange(other.texel_view_, VK_NULL_HANDLE);
    half_texel_view_ = std::exchange(other.half_texel_view_, VK_NULL_HANDLE);
    quad_view_ = std::exchange(other.quad_view_, VK_NULL_HANDLE);
    half_quad_view_ = std::exchange(other.half_quad_view_, VK_NULL_HANDLE);
    window_views_ = std::exchange(other.window_views_, {});
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, nullptr);
    pool_ = other.pool_;
    block_ = other.block_;
    offset_ = other.offset_;
    reserved_ = other.reserved_;
  }
  return *this;
}

void Buffer::release() {
  if (owner_ && handle_) owner_->free(*this);
  owner_ = nullptr;
  handle_ = VK_NULL_HANDLE;
  texel_view_ = VK_NULL_HANDLE;
  half_texel_view_ = VK_NULL_HANDLE;
  quad_view_ = VK_NULL_HANDLE;
  half_quad_view_ = VK_NULL_HANDLE;
  window_views_.clear();
}

VkBufferView Buffer::window_view(uint64_t offset, uint64_t bytes, bool half, bool quads) const {
  for (const WindowView& window : window_views_)
    if (window.offset == offset && window.bytes == bytes && window.half == half && window.quads == quads)
      return window.view;
  window_views_.push_back({offset, bytes, half, quads, owner_->make_window_view(*this, offset, bytes, half, quads)});
  return window_views_.back().view;
}

VkFormat texel_format(TexelLayout texels) {
  return texels.quads ? (texels.half ? VK_FORMAT_R16G16B16A16_SFLOAT : VK_FORMAT_R32G32B32A32_SFLOAT)
                      : (texels.half ? VK_FORMAT_R16_SFLOAT : VK_FORMAT_R32_SFLOAT);
}

Allocator::Allocator(Context& context, uint64_t budget) : context_(context) {
  constexpr VkFormatFeatureFlags kTexelBuffers =
      VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT | VK_FORMAT_FEATURE_STORAGE_TEXEL_BUFFER_BIT;
  for (TexelLayout texels : kTexelLayouts) {
    VkFormatProperties properties{};
    vkGetPhysicalDeviceFormatProperties(context.physical_device(), texel_format(texels), &properties);
    if ((properties.bufferFeatures & kTexelBuffers) != kTexelBuffers)
      throw Error(ExitCode::runtime_error, context.info().name + " cannot read format " +
                                               std::to_string(texel_format(texels)) +
                                               " as uniform and storage texel buffers, which tessera's kernels need");
  }
  uint64_t largest_heap = 0;
  for (auto& heap : context.info().heaps)
    if (heap.device_local) largest_heap = std::max(largest_heap, heap.size);
  stats_.budget_bytes = budget ? budget : largest_heap;
  const auto& limits = context.properties().limits;
  atom_ = std::max<uint64_t>(limits.nonCoherentAtomSize, 1);
  // Buffers start and end on atoms, so that a flush or invalidate of one never touches another.
  alignment_ = std::max<uint64_t>({alignment_, limits.minStorageBufferOffsetAlignment, atom_});
  const char* fault = std::getenv("TESSERA_FAULT");
  skip_flush_ = fault && std::strcmp(fault, "skip_flush") == 0;
  device_memory_mapped_ = context.info().heaps.size() == 1;  // as pool_for chooses
  VkMemoryRequirements requirements;
  VkBuffer buffer = create_buffer(context.device(), 4, nullptr, requirements);  // a probe
  storage_type_bits_ = requirements.memoryTypeBits;
  vkDestroyBuffer(context.device(), buffer, nullptr);
  if (context.info().host_memory_import) {
    host_pointer_properties_ = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(context.device(), "vkGetMemoryHostPointerPropertiesEXT"));
    import_host_ = host_pointer_properties_ != nullptr;
    import_alignment_ = std::max<uint64_t>({context.info().host_import_alignment, alignment_, 4096});
  }
}

Allocator::~Allocator() {
  for (auto& pool : pools_)
    for (auto& block : pool.blocks)
      if (block && block->memory) {
        vkFreeMemory(context_.device(), block->memory, nullptr);
        std::free(block->host);
      }
}

uint64_t Allocator::footprint(uint64_t bytes) const { return round_up(std::max<uint64_t>(bytes, 4), alignment_); }

uint64_t Allocator::device_footprint(uint64_t bytes, MemoryUsage usage) const {
  if (usage == MemoryUsage::host && import_host_) return 0;
  return in_device_heap(memory_type_for(usage, storage_type_bits_)) ? footprint(bytes) : 0;
}

uint64_t Allocator::transfer_footprint(uint64_t bytes) const {
  return device_memory_mapped_ ? 0 : device_footprint(bytes, MemoryUsage::staging);
}

bool Allocator::in_device_heap(uint32_t memory_type) const {
  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(context_.physical_device(), &memory);
  return memory.memoryHeaps[memory.memoryTypes[memory_type].heapIndex].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT;
}

uint32_t Allocator::memory_type_for(MemoryUsage usage, uint32_t type_bits) const {
  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(context_.physical_device(), &memory);
  auto find = [&](VkMemoryPropertyFlags required) -> int {
    for (uint32_t t = 0; t < memory.memoryTypeCount; ++t)
      if ((type_bits & (1u << t)) && (memory.memoryTypes[t].propertyFlags & required) == required)
        return static_cast<int>(t);
    return -1;
  };
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int type = -1;
  if (usage == MemoryUsage::host) usage = MemoryUsage::staging;  // where it is not imported
  if (usage == MemoryUsage::device) {
    // On devices with one heap (lavapipe, integrated GPUs) device memory is also mappable,
    // which lets uploads skip the staging copy.
    if (context_.info().heaps.size() == 1) type = find(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | host);
    if (type < 0) type = find(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  } else {
    // The host reads staging memory back (metrics, gradients, downloads): uncached reads are
    // slow, so cached memory first, coherent or not.
    type = find(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    if (type < 0) type = find(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
  }
  if (type < 0) type = find(0);
  if (type < 0) throw Error(ExitCode::runtime_error, "no Vulkan memory type fits a storage buffer");
  return static_cast<uint32_t>(type);
}

uint32_t Allocator::pool_for(MemoryUsage usage, uint32_t type_bits) {
  uint32_t type = memory_type_for(usage, type_bits);
  for (uint32_t p = 0; p < pools_.size(); ++p)
    if (pools_[p].memory_type == type && !pools_[p].imported) return p;
  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(context_.physical_device(), &memory);
  Pool pool;
  pool.memory_type = type;
  pool.host_visible = (memory.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;
  pool.coherent = (memory.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
  pool.device_heap = in_device_heap(type);
  pools_.push_back(std::move(pool));
  return static_cast<uint32_t>(pools_.size() - 1);
}

Allocator::Placement Allocator::place(const std::vector<std::unique_ptr<Block>>& blocks, uint64_t reserved,
                                      uint64_t alignment) {
  // First fit over the blocks' free ranges (trim() leaves empty slots).
  for (size_t b = 0; b < blocks.size(); ++b)
    if (blocks[b])
      for (auto [start, size] : blocks[b]->free) {
        uint64_t aligned = round_up(start, alignment);
        if (aligned + reserved <= start + size) return {b, aligned};
      }
  return {blocks.size(), 0};
}

uint64_t Allocator::new_block_size(uint64_t reserved, uint64_t reserved_now) const {
  uint64_t left = stats_.budget_bytes > reserved_now ? stats_.budget_bytes - reserved_now : 0;
  return std::max(std::min(kBlockSize, left), reserved);
}

void Allocator::carve(Block& block, uint64_t offset, uint64_t reserved) {
  auto range = std::prev(block.free.upper_bound(offset));
  uint64_t range_start = range->first, range_end = range->first + range->second;
  block.free.erase(range);
  if (offset > range_start) block.free[range_start] = offset - range_start;
  if (offset + reserved < range_end) block.free[offset + reserved] = range_end - offset - reserved;
  block.used += reserved;
}

uint64_t Allocator::reserved_after(const std::vector<PlannedBuffer>& buffers) const {
  // The pools' free ranges as they are now (no device memory), then each buffer placed.
  std::map<uint32_t, std::vector<std::unique_ptr<Block>>> pools;  // by memory type
  for (const Pool& pool : pools_)
    if (!pool.imported)
      for (auto& block : pool.blocks)
        pools[pool.memory_type].push_back(block ? std::make_unique<Block>(Block{VK_NULL_HANDLE, block->size, nullptr,
                                                                                  block->free, block->used})
                                                : nullptr);
  uint64_t reserved_bytes = stats_.reserved_bytes;
  for (const PlannedBuffer& buffer : buffers) {
    if (buffer.usage == MemoryUsage::host && import_host_) continue;  // the host's memory
    uint32_t type = memory_type_for(buffer.usage, storage_type_bits_);
    bool counted = in_device_heap(type);
    auto& blocks = pools[type];
    uint64_t reserved = footprint(buffer.bytes);
    Placement placement = place(blocks, reserved, alignment_);
    if (placement.block == blocks.size()) {
      auto block = std::make_unique<Block>();
      block->size = counted ? new_block_size(reserved, reserved_bytes) : std::max(kBlockSize, reserved);
      block->free[0] = block->size;
      reserved_bytes += counted ? block->size : 0;
      blocks.push_back(std::move(block));
    }
    carve(*blocks[placement.block], placement.offset, reserved);
  }
  return reserved_bytes;
}

Buffer Allocator::allocate(uint64_t bytes, MemoryUsage usage, const std::string& what, bool windowed) {
  VkDevice device = context_.device();
  if (bytes > context_.info().largest_buffer && !windowed)
    throw OutOfDeviceMemory(what + ": a buffer of " + format_bytes(bytes) + " is over the device's largest buffer (" +
                            format_bytes(context_.info().largest_buffer) + ")");
  if (usage == MemoryUsage::host && import_host_) return import_host(bytes, what);
  Buffer buffer;
  VkMemoryRequirements requirements;
  buffer.handle_ = create_buffer(device, bytes, nullptr, requirements);
  uint64_t alignment = std::max<uint64_t>(requirements.alignment, alignment_);
  uint64_t reserved = round_up(requirements.size, alignment);
  uint32_t p = pool_for(usage, requirements.memoryTypeBits);
  const bool counted = pools_[p].device_heap;
  if (counted && stats_.live_bytes + reserved > stats_.budget_bytes) {
    vkDestroyBuffer(device, buffer.handle_, nullptr);
    buffer.handle_ = VK_NULL_HANDLE;
    throw OutOfDeviceMemory(what + ": asked for " + format_bytes(reserved) + " with " +
                            format_bytes(stats_.live_bytes) + " in use; the device memory budget is " +
                            format_bytes(stats_.budget_bytes) + " (--device-memory-limit)");
  }
  Pool& pool = pools_[p];

  auto [block_index, offset] = place(pool.blocks, reserved, alignment);
  if (block_index == pool.blocks.size()) {
    // The budget bounds the blocks taken from the device, not only the live buffers in them:
    // the last block is cut to what the budget has left.
    uint64_t left = stats_.budget_bytes > stats_.reserved_bytes ? stats_.budget_bytes - stats_.reserved_bytes : 0;
    if (counted && reserved > left) {
      vkDestroyBuffer(device, buffer.handle_, nullptr);
      buffer.handle_ = VK_NULL_HANDLE;
      throw OutOfDeviceMemory(what + ": asked for " + format_bytes(reserved) + " with " +
                              format_bytes(stats_.reserved_bytes) + " of device memory blocks taken (" +
                              format_bytes(stats_.live_bytes) + " in use); the device memory budget is " +
                              format_bytes(stats_.budget_bytes) + " (--device-memory-limit)");
    }
    auto block = std::make_unique<Block>();
    block->size = counted ? new_block_size(reserved, stats_.reserved_bytes) : std::max(kBlockSize, reserved);
    VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    allocate.allocationSize = block->size;
    allocate.memoryTypeIndex = pool.memory_type;
    VkResult result = vkAllocateMemory(device, &allocate, nullptr, &block->memory);
    if (result != VK_SUCCESS) {
      vkDestroyBuffer(device, buffer.handle_, nullptr);
      buffer.handle_ = VK_NULL_HANDLE;
      throw OutOfDeviceMemory(what + ": the device refused a block of " + format_bytes(block->size) +
                              " (VkResult " + std::to_string(result) + ") with " +
                              format_bytes(stats_.reserved_bytes) + " already reserved");
    }
    if (pool.host_visible)
      check(vkMapMemory(device, block->memory, 0, VK_WHOLE_SIZE, 0, &block->mapped), "vkMapMemory");
    block->free[0] = block->size;
    if (counted) stats_.reserved_bytes += block->size;
    // Reuse a slot that trim() emptied.
    auto empty = std::find(pool.blocks.begin(), pool.blocks.end(), nullptr);
    block_index = static_cast<size_t>(empty - pool.blocks.begin());
    if (empty != pool.blocks.end())
      *empty = std::move(block);
    else
      pool.blocks.push_back(std::move(block));
  }

  Block& block = *pool.blocks[block_index];
  carve(block, offset, reserved);

  check(vkBindBufferMemory(device, buffer.handle_, block.memory, offset), "vkBindBufferMemory");
  buffer.owner_ = this;
  buffer.size_ = bytes;
  buffer.mapped_ = block.mapped ? static_cast<char*>(block.mapped) + offset : nullptr;
  buffer.pool_ = p;
  buffer.block_ = static_cast<uint32_t>(block_index);
  buffer.offset_ = offset;
  buffer.reserved_ = reserved;
  if (counted) stats_.live_bytes += reserved;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  stats_.allocations++;
  make_views(buffer, bytes);
  return buffer;
}

Buffer Allocator::import_host(uint64_t bytes, const std::string& what) {
  VkDevice device = context_.device();
  VkExternalMemoryBufferCreateInfo external{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  external.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  Buffer buffer;
  VkMemoryRequirements requirements;
  buffer.handle_ = create_buffer(device, bytes, &external, requirements);
  const uint64_t alignment = std::max<uint64_t>(requirements.alignment, import_alignment_);
  const uint64_t size = round_up(requirements.size, alignment);
  auto block = std::make_unique<Block>();
  block->host = std::aligned_alloc(alignment, size);
  auto fail = [&](const std::string& problem) {
    vkDestroyBuffer(device, buffer.handle_, nullptr);
    buffer.handle_ = VK_NULL_HANDLE;
    std::free(block->host);
    return OutOfDeviceMemory(what + ": " + problem);
  };
  if (!block->host) throw fail("the host refused " + format_bytes(size) + " of memory");
  VkMemoryHostPointerPropertiesEXT pointer{VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
  if (VkResult result = host_pointer_properties_(device, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
                                                 block->host, &pointer);
      result != VK_SUCCESS)
    throw fail("the device cannot import host memory (vkGetMemoryHostPointerPropertiesEXT: VkResult " +
               std::to_string(result) + ")");
  // Coherent memory: the host writes it as weights load, then only the device reads it.
  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(context_.physical_device(), &memory);
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  uint32_t type = memory.memoryTypeCount;
  for (uint32_t t = 0; t < memory.memoryTypeCount && type == memory.memoryTypeCount; ++t)
    if ((requirements.memoryTypeBits & pointer.memoryTypeBits & (1u << t)) &&
        (memory.memoryTypes[t].propertyFlags & host) == host)
      type = t;
  if (type == memory.memoryTypeCount) throw fail("the device offers no coherent memory type over host memory");
  VkImportMemoryHostPointerInfoEXT import{VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT};
  import.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  import.pHostPointer = block->host;
  VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.pNext = &import;
  allocate.allocationSize = size;
  allocate.memoryTypeIndex = type;
  if (VkResult result = vkAllocateMemory(device, &allocate, nullptr, &block->memory); result != VK_SUCCESS)
    throw fail("the device refused to import " + format_bytes(size) + " of host memory (VkResult " +
               std::to_string(result) + ")");
  if (VkResult result = vkBindBufferMemory(device, buffer.handle_, block->memory, 0); result != VK_SUCCESS) {
    vkFreeMemory(device, block->memory, nullptr);
    throw fail("vkBindBufferMemory refused the imported memory (VkResult " + std::to_string(result) + ")");
  }
  block->size = block->used = size;
  block->mapped = block->host;
  auto pool = std::find_if(pools_.begin(), pools_.end(), [&](const Pool& p) { return p.imported && p.memory_type == type; });
  if (pool == pools_.end()) {
    pools_.push_back(Pool{type, true, true, false, true, {}});
    pool = pools_.end() - 1;
  }
  auto empty = std::find(pool->blocks.begin(), pool->blocks.end(), nullptr);
  if (empty == pool->blocks.end()) empty = pool->blocks.insert(empty, nullptr);
  buffer.owner_ = this;
  buffer.size_ = bytes;
  buffer.mapped_ = block->host;
  buffer.pool_ = static_cast<uint32_t>(pool - pools_.begin());
  buffer.block_ = static_cast<uint32_t>(empty - pool->blocks.begin());
  buffer.offset_ = 0;
  buffer.reserved_ = size;
  *empty = std::move(block);
  stats_.allocations++;
  make_views(buffer, bytes);
  return buffer;
}

void Allocator::make_views(Buffer& buffer, uint64_t bytes) const {
  VkDevice device = context_.device();
  // A tensor within the buffer has at most maxTexelBufferElements elements (Context's largest_buffer).
  uint64_t max_texels = context_.properties().limits.maxTexelBufferElements;
  for (TexelLayout texels : kTexelLayouts) {
    uint64_t count = std::min(bytes / texel_bytes(texels), max_texels);
    if (count == 0) continue;
    VkBufferViewCreateInfo view_info{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
    view_info.buffer = buffer.handle_;
    view_info.format = texel_format(texels);
    view_info.range = count * texel_bytes(texels);
    VkBufferView& view = texels.quads ? (texels.half ? buffer.half_quad_view_ : buffer.quad_view_)
                                      : (texels.half ? buffer.half_texel_view_ : buffer.texel_view_);
    check(vkCreateBufferView(device, &view_info, nullptr, &view), "vkCreateBufferView");
  }
}

VkBufferView Allocator::make_window_view(const Buffer& buffer, uint64_t offset, uint64_t bytes, bool half,
                                         bool quads) const {
  const uint64_t texel = texel_bytes({half, quads});
  VkBufferViewCreateInfo view_info{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
  view_info.buffer = buffer.handle_;
  view_info.format = texel_format({half, quads});
  view_info.offset = offset;
  view_info.range = bytes / texel * texel;
  VkBufferView view = VK_NULL_HANDLE;
  check(vkCreateBufferView(context_.device(), &view_info, nullptr, &view), "vkCreateBufferView");
  return view;
}

void Allocator::free(Buffer& buffer) {
  for (auto& window : buffer.window_views_) vkDestroyBufferView(context_.device(), window.view, nullptr);
  if (buffer.texel_view_) vkDestroyBufferView(context_.device(), buffer.texel_view_, nullptr);
  if (buffer.half_texel_view_) vkDestroyBufferView(context_.device(), buffer.half_texel_view_, nullptr);
  if (buffer.quad_view_) vkDestroyBufferView(context_.device(), buffer.quad_view_, nullptr);
  if (buffer.half_quad_view_) vkDestroyBufferView(context_.device(), buffer.half_quad_view_, nullptr);
  vkDestroyBuffer(context_.device(), buffer.handle_, nullptr);
  if (pools_[buffer.pool_].imported) {  // a block of its own, over host memory: both go back
    auto& imported = pools_[buffer.pool_].blocks[buffer.block_];
    vkFreeMemory(context_.device(), imported->memory, nullptr);
    std::free(imported->host);
    imported.reset();
    return;
  }
  Block& block = *pools_[buffer.pool_].blocks[buffer.block_];
  uint64_t start = buffer.offset_, size = buffer.reserved_;
  // Coalesce with the neighbouring free ranges.
  auto next = block.free.lower_bound(start);
  if (next != block.free.end() && next->first == start + size) {
    size += next->second;
    next = block.free.erase(next);
  }
  if (next != block.free.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == start) {
      start = previous->first;
      size += previous->second;
      block.free.erase(previous);
    }
  }
  block.free[start] = size;
  block.used -= buffer.reserved_;
  if (pools_[buffer.pool_].device_heap) stats_.live_bytes -= buffer.reserved_;
}

void Allocator::sync_host(const Buffer& buffer, uint64_t offset, uint64_t bytes, bool flush) const {
  const Pool& pool = pools_[buffer.pool_];
  if (!pool.host_visible)
    throw std::logic_error("flush or invalidate of a buffer the host cannot map (" + std::to_string(buffer.size_) +
                           " bytes)");
  if (pool.coherent || (flush && skip_flush_)) return;
  if (bytes == VK_WHOLE_SIZE) bytes = buffer.size_ - std::min(offset, buffer.size_);
  if (bytes == 0) return;
  // Whole atoms, within the buffer's own aligned range.
  uint64_t begin = buffer.offset_ + offset / atom_ * atom_;
  uint64_t end = std::min(buffer.offset_ + round_up(offset + bytes, atom_), buffer.offset_ + buffer.reserved_);
  VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE};
  range.memory = pool.blocks[buffer.block_]->memory;
  range.offset = begin;
  range.size = end - begin;
  if (flush)
    check(vkFlushMappedMemoryRanges(context_.device(), 1, &range), "vkFlushMappedMemoryRanges");
  else
    check(vkInvalidateMappedMemoryRanges(context_.device(), 1, &range), "vkInvalidateMappedMemoryRanges");
}

void Allocator::trim() {
  for (auto& pool : pools_)
    for (auto& block : pool.blocks)
      if (block && block->used == 0) {
        vkFreeMemory(context_.device(), block->memory, nullptr);
        if (pool.device_heap) stats_.reserved_bytes -= block->size;
        block.reset();
      }
}

}  // namespace tessera::vk
