// VK_LAYER_TESSERA_discrete_gpu itself (tests/support/discrete_gpu), on a device of its own without
// the validation layer (some of these calls break the rules on purpose): it reports a discrete
// GPU's memory and holds the application to it, so the tests that run under it can trust it.
#include <gtest/gtest.h>
#include <vulkan/vulkan.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr VkDeviceSize kBytes = 4096;
constexpr uint32_t kDeviceLocal = 0, kHostCoherent = 1, kHostCached = 2;

void ok(VkResult result) { ASSERT_EQ(result, VK_SUCCESS); }

// An instance with the layer (found in the build folder) and lavapipe's device under it.
class LayerDevice {
 public:
  LayerDevice() {
    // Beside the layer folders already named (a bundle names its validation layer's); where
    // VK_LAYER_PATH is set, the loader reads only it.
    const char* variable = std::getenv("VK_LAYER_PATH") ? "VK_LAYER_PATH" : "VK_ADD_LAYER_PATH";
    std::string folders = TESSERA_DISCRETE_GPU_LAYER_DIR;
    if (const char* named = std::getenv(variable)) folders += std::string(":") + named;
    setenv(variable, folders.c_str(), 1);
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.apiVersion = VK_API_VERSION_1_2;
    const char* layers[] = {"VK_LAYER_TESSERA_discrete_gpu"};
    VkInstanceCreateInfo create{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    create.pApplicationInfo = &app;
    create.enabledLayerCount = 1;
    create.ppEnabledLayerNames = layers;
    if (vkCreateInstance(&create, nullptr, &instance) != VK_SUCCESS) std::abort();
    uint32_t count = 1;
    vkEnumeratePhysicalDevices(instance, &count, &physical);
    float priority = 1;
    VkDeviceQueueCreateInfo queue_info{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    queue_info.queueCount = 1;
    queue_info.pQueuePriorities = &priority;
    VkDeviceCreateInfo device_info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    device_info.queueCreateInfoCount = 1;
    device_info.pQueueCreateInfos = &queue_info;
    if (vkCreateDevice(physical, &device_info, nullptr, &device) != VK_SUCCESS) std::abort();
    vkGetDeviceQueue(device, 0, 0, &queue);
    VkCommandPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    vkCreateCommandPool(device, &pool_info, nullptr, &pool);
  }
  ~LayerDevice() {
    vkDeviceWaitIdle(device);
    for (VkBuffer buffer : buffers) vkDestroyBuffer(device, buffer, nullptr);
    for (VkDeviceMemory memory : memories) vkFreeMemory(device, memory, nullptr);
    vkDestroyCommandPool(device, pool, nullptr);
    vkDestroyDevice(device, nullptr);
    vkDestroyInstance(instance, nullptr);
  }

  VkDeviceMemory allocate(uint32_t type) {
    VkMemoryAllocateInfo info{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    info.allocationSize = kBytes;
    info.memoryTypeIndex = type;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    if (vkAllocateMemory(device, &info, nullptr, &memory) != VK_SUCCESS) std::abort();
    memories.push_back(memory);
    return memory;
  }

  VkBuffer buffer(VkDeviceMemory memory) {
    VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    info.size = kBytes;
    info.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    VkBuffer buffer = VK_NULL_HANDLE;
    vkCreateBuffer(device, &info, nullptr, &buffer);
    vkBindBufferMemory(device, buffer, memory, 0);
    buffers.push_back(buffer);
    return buffer;
  }

  uint8_t* map(VkDeviceMemory memory) {
    void* mapped = nullptr;
    if (vkMapMemory(device, memory, 0, VK_WHOLE_SIZE, 0, &mapped) != VK_SUCCESS) std::abort();
    return static_cast<uint8_t*>(mapped);
  }

  VkResult flush(VkDeviceMemory memory, VkDeviceSize offset = 0, VkDeviceSize size = VK_WHOLE_SIZE) {
    VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, memory, offset, size};
    return vkFlushMappedMemoryRanges(device, 1, &range);
  }

  VkResult invalidate(VkDeviceMemory memory) {
    VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, memory, 0, VK_WHOLE_SIZE};
    return vkInvalidateMappedMemoryRanges(device, 1, &range);
  }

  // Runs a copy (from != null) or a fill of `to`, with the host's writes before it and its
  // writes made available to the host after it.
  void run(VkBuffer from, VkBuffer to, uint32_t fill = 0) {
    VkCommandBufferAllocateInfo info{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    info.commandPool = pool;
    info.commandBufferCount = 1;
    VkCommandBuffer commands = VK_NULL_HANDLE;
    vkAllocateCommandBuffers(device, &info, &commands);
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(commands, &begin);
    VkMemoryBarrier before{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_HOST_WRITE_BIT,
                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    vkCmdPipelineBarrier(commands, VK_PIPELINE_STAGE_HOST_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &before, 0,
                         nullptr, 0, nullptr);
    if (from) {
      VkBufferCopy region{0, 0, kBytes};
      vkCmdCopyBuffer(commands, from, to, 1, &region);
    } else {
      vkCmdFillBuffer(commands, to, 0, VK_WHOLE_SIZE, fill);
    }
    VkMemoryBarrier after{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(commands, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &after, 0,
                         nullptr, 0, nullptr);
    vkEndCommandBuffer(commands);
    VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &commands;
    vkQueueSubmit(queue, 1, &submit, VK_NULL_HANDLE);
    vkQueueWaitIdle(queue);
    vkFreeCommandBuffers(device, pool, 1, &commands);
  }

  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  std::vector<VkDeviceMemory> memories;
  std::vector<VkBuffer> buffers;
};

bool all_bytes(const uint8_t* bytes, uint8_t value) {
  for (VkDeviceSize i = 0; i < kBytes; ++i)
    if (bytes[i] != value) return false;
  return true;
}

TEST(DiscreteGpuLayer, ReportsADiscreteGpusMemory) {
  LayerDevice gpu;
  VkPhysicalDeviceProperties2 properties{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  vkGetPhysicalDeviceProperties2(gpu.physical, &properties);
  EXPECT_EQ(properties.properties.deviceType, VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU);
  EXPECT_EQ(properties.properties.limits.nonCoherentAtomSize, 256u);

  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(gpu.physical, &memory);
  ASSERT_EQ(memory.memoryHeapCount, 2u);
  EXPECT_TRUE(memory.memoryHeaps[0].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT);
  EXPECT_FALSE(memory.memoryHeaps[1].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT);
  ASSERT_EQ(memory.memoryTypeCount, 3u);
  EXPECT_EQ(memory.memoryTypes[kDeviceLocal].propertyFlags, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  EXPECT_EQ(memory.memoryTypes[kHostCoherent].propertyFlags,
            VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  EXPECT_EQ(memory.memoryTypes[kHostCached].propertyFlags,
            VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  EXPECT_EQ(memory.memoryTypes[kHostCoherent].heapIndex, 1u);

  VkBuffer buffer = gpu.buffer(gpu.allocate(kDeviceLocal));
  VkMemoryRequirements requirements;
  vkGetBufferMemoryRequirements(gpu.device, buffer, &requirements);
  EXPECT_EQ(requirements.memoryTypeBits, 0b111u) << "every reported type stands on lavapipe's one type";
}

TEST(DiscreteGpuLayer, DeviceLocalMemoryCannotBeMapped) {
  LayerDevice gpu;
  void* mapped = nullptr;
  EXPECT_EQ(vkMapMemory(gpu.device, gpu.allocate(kDeviceLocal), 0, VK_WHOLE_SIZE, 0, &mapped),
            VK_ERROR_MEMORY_MAP_FAILED);
}

TEST(DiscreteGpuLayer, CachedHostWritesReachTheDeviceOnlyWhenFlushed) {
  LayerDevice gpu;
  VkDeviceMemory cached = gpu.allocate(kHostCached), coherent = gpu.allocate(kHostCoherent);
  VkBuffer source = gpu.buffer(cached), target = gpu.buffer(coherent);
  uint8_t* host = gpu.map(cached);
  const uint8_t* seen = gpu.map(coherent);
  std::memset(host, 0xAA, kBytes);
  ok(gpu.flush(cached));
  std::memset(host, 0x55, kBytes);
  gpu.run(source, target);
  EXPECT_TRUE(all_bytes(seen, 0xAA)) << "an unflushed write reached the device";
  ok(gpu.flush(cached, 0, 256));
  gpu.run(source, target);
  EXPECT_EQ(seen[0], 0x55);
  EXPECT_EQ(seen[255], 0x55);
  EXPECT_EQ(seen[256], 0xAA) << "a flush reached past its range";
  ok(gpu.flush(cached));
  gpu.run(source, target);
  EXPECT_TRUE(all_bytes(seen, 0x55));
}

TEST(DiscreteGpuLayer, DeviceWritesReachCachedMemoryOnlyWhenInvalidated) {
  LayerDevice gpu;
  VkDeviceMemory cached = gpu.allocate(kHostCached);
  VkBuffer buffer = gpu.buffer(cached);
  uint8_t* host = gpu.map(cached);
  std::memset(host, 0, kBytes);
  ok(gpu.flush(cached));
  gpu.run(VK_NULL_HANDLE, buffer, 0x77777777u);
  EXPECT_TRUE(all_bytes(host, 0)) << "the device's write reached the host without an invalidate";
  ok(gpu.invalidate(cached));
  EXPECT_TRUE(all_bytes(host, 0x77));
}

TEST(DiscreteGpuLayer, CoherentMemoryNeedsNeither) {
  LayerDevice gpu;
  VkDeviceMemory coherent = gpu.allocate(kHostCoherent), other = gpu.allocate(kHostCoherent);
  VkBuffer source = gpu.buffer(coherent), target = gpu.buffer(other);
  std::memset(gpu.map(coherent), 0x3C, kBytes);
  gpu.run(source, target);
  EXPECT_TRUE(all_bytes(gpu.map(other), 0x3C));
}

TEST(DiscreteGpuLayerDeathTest, RangesOffTheAtomAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  LayerDevice gpu;
  VkDeviceMemory cached = gpu.allocate(kHostCached);
  gpu.map(cached);
  EXPECT_DEATH(gpu.flush(cached, 64, 256), "offset is not a multiple of nonCoherentAtomSize");
  EXPECT_DEATH(gpu.flush(cached, 0, 100), "size is not a multiple of nonCoherentAtomSize");
  VkDeviceMemory unmapped = gpu.allocate(kHostCached);
  EXPECT_DEATH(gpu.invalidate(unmapped), "the memory is not mapped");
}

}  // namespace
