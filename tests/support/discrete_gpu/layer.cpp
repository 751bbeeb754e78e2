// VK_LAYER_TESSERA_discrete_gpu: presents the device below it (lavapipe, in CI) as a discrete GPU,
// so that the paths tessera takes on a GPU run on a machine without one. It reports
//  - deviceType DISCRETE_GPU and a GPU's nonCoherentAtomSize (256, the spec's largest);
//  - two heaps: device-local memory the host cannot map (type 0), and host memory with a coherent
//    type (1) and a cached, non-coherent one (2);
// and holds the application to them:
//  - vkMapMemory of type 0 fails (VK_ERROR_MEMORY_MAP_FAILED);
//  - a mapping of type 2 is a copy of the memory taken when it is mapped: the host's writes reach
//    the device only at vkFlushMappedMemoryRanges, and the device's writes reach the copy only at
//    vkInvalidateMappedMemoryRanges, each over whole atoms, as a write-back cache does; so a
//    missing flush or invalidate gives wrong numbers, not luck;
//  - a flush or invalidate range off the atom size or outside the mapping aborts, naming the rule.
// The driver's memory behind the types is unchanged: each reported type stands for a driver type.
// Put the Khronos validation layer above this one so that it checks against the reported device.
#include <vulkan/vk_layer.h>
#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

namespace {

constexpr VkDeviceSize kAtom = 256;

enum ReportedType : uint32_t { kDeviceLocal, kHostCoherent, kHostCached, kTypeCount };

[[noreturn]] void misuse(const char* what, const char* rule) {
  std::fprintf(stderr, "VK_LAYER_TESSERA_discrete_gpu: %s (%s)\n", what, rule);
  std::abort();
}

// The memory the layer reports, and the driver's type behind each reported one.
struct MemoryModel {
  VkPhysicalDeviceMemoryProperties reported{};
  uint32_t driver_type[kTypeCount] = {};
  uint32_t driver_heap[2] = {};

  explicit MemoryModel(const VkPhysicalDeviceMemoryProperties& driver) {
    auto find = [&](VkMemoryPropertyFlags required) {
      for (uint32_t t = 0; t < driver.memoryTypeCount; ++t)
        if ((driver.memoryTypes[t].propertyFlags & required) == required) return t;
      misuse("the driver has no memory type the layer can stand on", "a device-local and a host-visible type");
    };
    driver_type[kDeviceLocal] = find(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    driver_type[kHostCoherent] = find(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    driver_type[kHostCached] = find(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
    driver_heap[0] = driver.memoryTypes[driver_type[kDeviceLocal]].heapIndex;
    driver_heap[1] = driver.memoryTypes[driver_type[kHostCoherent]].heapIndex;
    reported.memoryHeapCount = 2;
    reported.memoryHeaps[0] = {driver.memoryHeaps[driver_heap[0]].size, VK_MEMORY_HEAP_DEVICE_LOCAL_BIT};
    reported.memoryHeaps[1] = {driver.memoryHeaps[driver_heap[1]].size, 0};
    reported.memoryTypeCount = kTypeCount;
    reported.memoryTypes[kDeviceLocal] = {VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0};
    reported.memoryTypes[kHostCoherent] = {VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 1};
    reported.memoryTypes[kHostCached] = {VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 1};
  }

  // The reported types a resource may take, from the driver types it may take.
  uint32_t reported_bits(uint32_t driver_bits) const {
    uint32_t bits = 0;
    for (uint32_t t = 0; t < kTypeCount; ++t)
      if (driver_bits & (1u << driver_type[t])) bits |= 1u << t;
    return bits;
  }
};

template <class T>
T next_proc(PFN_vkGetInstanceProcAddr next, VkInstance instance, const char* name) {
  return reinterpret_cast<T>(next(instance, name));
}

struct Instance {
  VkInstance handle = VK_NULL_HANDLE;
  PFN_vkGetInstanceProcAddr next = nullptr;
  PFN_vkDestroyInstance destroy = nullptr;
  PFN_vkEnumeratePhysicalDevices enumerate = nullptr;
  PFN_vkEnumeratePhysicalDeviceGroups enumerate_groups = nullptr;
  PFN_vkGetPhysicalDeviceProperties properties = nullptr;
  PFN_vkGetPhysicalDeviceProperties2 properties2 = nullptr;
  PFN_vkGetPhysicalDeviceMemoryProperties memory_properties = nullptr;
  PFN_vkGetPhysicalDeviceMemoryProperties2 memory_properties2 = nullptr;
};

// A mapping of host-cached memory: the host's copy, covering [0, offset + size) of the memory
// so that pointers keep the driver's alignment, and the driver's mapping of [offset, offset + size).
struct Mapping {
  VkDeviceSize offset = 0, size = 0;
  char* driver = nullptr;
  std::unique_ptr<char, decltype(&std::free)> copy{nullptr, &std::free};
};

struct Memory {
  uint32_t type = 0;
  VkDeviceSize size = 0;
  std::unique_ptr<Mapping> mapping;  // type kHostCached while mapped
};

struct Device {
  VkDevice handle = VK_NULL_HANDLE;
  Instance* instance = nullptr;
  std::unique_ptr<MemoryModel> model;
  PFN_vkGetDeviceProcAddr next = nullptr;
  PFN_vkDestroyDevice destroy = nullptr;
  PFN_vkAllocateMemory allocate = nullptr;
  PFN_vkFreeMemory free = nullptr;
  PFN_vkMapMemory map = nullptr;
  PFN_vkUnmapMemory unmap = nullptr;
  PFN_vkFlushMappedMemoryRanges flush = nullptr;
  PFN_vkInvalidateMappedMemoryRanges invalidate = nullptr;
  PFN_vkGetBufferMemoryRequirements buffer_requirements = nullptr;
  PFN_vkGetBufferMemoryRequirements2 buffer_requirements2 = nullptr;
  PFN_vkGetImageMemoryRequirements image_requirements = nullptr;
  PFN_vkGetImageMemoryRequirements2 image_requirements2 = nullptr;
  PFN_vkGetDeviceBufferMemoryRequirements device_buffer_requirements = nullptr;
  PFN_vkGetDeviceImageMemoryRequirements device_image_requirements = nullptr;
  std::unordered_map<VkDeviceMemory, Memory> memories;
};

// Every object the layer knows, under one lock (tests are light; correctness is the point).
// Never destroyed: an application may free its Vulkan objects from its own static destructors,
// after this library's would have run.
struct Registry {
  std::mutex lock;
  std::unordered_map<VkInstance, std::unique_ptr<Instance>> instances;
  std::unordered_map<VkPhysicalDevice, Instance*> physical_devices;
  std::unordered_map<VkDevice, std::unique_ptr<Device>> devices;
};
Registry& registry = *new Registry;
std::mutex& lock = registry.lock;
auto& instances = registry.instances;
auto& physical_devices = registry.physical_devices;
auto& devices = registry.devices;

Instance& instance_of(VkPhysicalDevice physical_device) {
  std::lock_guard guard(lock);
  auto it = physical_devices.find(physical_device);
  if (it == physical_devices.end()) misuse("a physical device no instance enumerated", "vkEnumeratePhysicalDevices");
  return *it->second;
}

Instance* instance_of(VkInstance instance) {
  std::lock_guard guard(lock);
  return instances.at(instance).get();
}

Device& device_of(VkDevice device) {
  std::lock_guard guard(lock);
  return *devices.at(device);
}

// Takes an instance's or device's record out of the registry (null if it holds none).
template <class Handle, class Record>
std::unique_ptr<Record> take(std::unordered_map<Handle, std::unique_ptr<Record>>& records, Handle handle) {
  std::lock_guard guard(lock);
  auto it = records.find(handle);
  if (it == records.end()) return nullptr;
  auto record = std::move(it->second);
  records.erase(it);
  if constexpr (std::is_same_v<Record, Instance>)
    std::erase_if(physical_devices, [&](auto& entry) { return entry.second == record.get(); });
  return record;
}

template <class Info>
Info* chain_link(const void* next, VkStructureType type) {
  for (auto* info = static_cast<const VkBaseInStructure*>(next); info; info = info->pNext)
    if (info->sType == type && reinterpret_cast<const Info*>(info)->function == VK_LAYER_LINK_INFO)
      return const_cast<Info*>(reinterpret_cast<const Info*>(info));
  return nullptr;
}

// ---- instance level -------------------------------------------------------------------------

VKAPI_ATTR VkResult VKAPI_CALL CreateInstance(const VkInstanceCreateInfo* create, const VkAllocationCallbacks* allocator,
                                              VkInstance* out) {
  auto* link = chain_link<VkLayerInstanceCreateInfo>(create->pNext, VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO);
  if (!link) return VK_ERROR_INITIALIZATION_FAILED;
  PFN_vkGetInstanceProcAddr next = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  link->u.pLayerInfo = link->u.pLayerInfo->pNext;
  auto create_next = next_proc<PFN_vkCreateInstance>(next, VK_NULL_HANDLE, "vkCreateInstance");
  VkResult result = create_next(create, allocator, out);
  if (result != VK_SUCCESS) return result;
  auto instance = std::make_unique<Instance>();
  instance->handle = *out;
  instance->next = next;
  instance->destroy = next_proc<PFN_vkDestroyInstance>(next, *out, "vkDestroyInstance");
  instance->enumerate = next_proc<PFN_vkEnumeratePhysicalDevices>(next, *out, "vkEnumeratePhysicalDevices");
  instance->enumerate_groups = next_proc<PFN_vkEnumeratePhysicalDeviceGroups>(next, *out, "vkEnumeratePhysicalDeviceGroups");
  instance->properties = next_proc<PFN_vkGetPhysicalDeviceProperties>(next, *out, "vkGetPhysicalDeviceProperties");
  instance->properties2 = next_proc<PFN_vkGetPhysicalDeviceProperties2>(next, *out, "vkGetPhysicalDeviceProperties2");
  if (!instance->properties2)
    instance->properties2 = next_proc<PFN_vkGetPhysicalDeviceProperties2>(next, *out, "vkGetPhysicalDeviceProperties2KHR");
  instance->memory_properties =
      next_proc<PFN_vkGetPhysicalDeviceMemoryProperties>(next, *out, "vkGetPhysicalDeviceMemoryProperties");
  instance->memory_properties2 =
      next_proc<PFN_vkGetPhysicalDeviceMemoryProperties2>(next, *out, "vkGetPhysicalDeviceMemoryProperties2");
  if (!instance->memory_properties2)
    instance->memory_properties2 =
        next_proc<PFN_vkGetPhysicalDeviceMemoryProperties2>(next, *out, "vkGetPhysicalDeviceMemoryProperties2KHR");
  std::lock_guard guard(lock);
  instances[*out] = std::move(instance);
  return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL DestroyInstance(VkInstance handle, const VkAllocationCallbacks* allocator) {
  if (auto instance = take(instances, handle)) instance->destroy(handle, allocator);
}

VKAPI_ATTR VkResult VKAPI_CALL EnumeratePhysicalDevices(VkInstance handle, uint32_t* count, VkPhysicalDevice* out) {
  Instance* instance = instance_of(handle);
  VkResult result = instance->enumerate(handle, count, out);
  if (out && (result == VK_SUCCESS || result == VK_INCOMPLETE)) {
    std::lock_guard guard(lock);
    for (uint32_t i = 0; i < *count; ++i) physical_devices[out[i]] = instance;
  }
  return result;
}

VKAPI_ATTR VkResult VKAPI_CALL EnumeratePhysicalDeviceGroups(VkInstance handle, uint32_t* count,
                                                             VkPhysicalDeviceGroupProperties* out) {
  Instance* instance = instance_of(handle);
  VkResult result = instance->enumerate_groups(handle, count, out);
  if (out && (result == VK_SUCCESS || result == VK_INCOMPLETE)) {
    std::lock_guard guard(lock);
    for (uint32_t g = 0; g < *count; ++g)
      for (uint32_t i = 0; i < out[g].physicalDeviceCount; ++i) physical_devices[out[g].physicalDevices[i]] = instance;
  }
  return result;
}

void present_as_discrete(VkPhysicalDeviceProperties& properties) {
  properties.deviceType = VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
  properties.limits.nonCoherentAtomSize = std::max(properties.limits.nonCoherentAtomSize, kAtom);
}

VKAPI_ATTR void VKAPI_CALL GetPhysicalDeviceProperties(VkPhysicalDevice device, VkPhysicalDeviceProperties* out) {
  instance_of(device).properties(device, out);
  present_as_discrete(*out);
}

VKAPI_ATTR void VKAPI_CALL GetPhysicalDeviceProperties2(VkPhysicalDevice device, VkPhysicalDeviceProperties2* out) {
  instance_of(device).properties2(device, out);
  present_as_discrete(out->properties);
}

MemoryModel model_of(Instance& instance, VkPhysicalDevice device) {
  VkPhysicalDeviceMemoryProperties driver;
  instance.memory_properties(device, &driver);
  return MemoryModel(driver);
}

VKAPI_ATTR void VKAPI_CALL GetPhysicalDeviceMemoryProperties(VkPhysicalDevice device,
                                                             VkPhysicalDeviceMemoryProperties* out) {
  *out = model_of(instance_of(device), device).reported;
}

VKAPI_ATTR void VKAPI_CALL GetPhysicalDeviceMemoryProperties2(VkPhysicalDevice device,
                                                              VkPhysicalDeviceMemoryProperties2* out) {
  Instance& instance = instance_of(device);
  instance.memory_properties2(device, out);
  MemoryModel model(out->memoryProperties);
  out->memoryProperties = model.reported;
  // VK_EXT_memory_budget, where the driver has it: each reported heap has its driver heap's figures.
  for (auto* next = static_cast<VkBaseOutStructure*>(out->pNext); next; next = next->pNext)
    if (next->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT) {
      auto* budget = reinterpret_cast<VkPhysicalDeviceMemoryBudgetPropertiesEXT*>(next);
      VkPhysicalDeviceMemoryBudgetPropertiesEXT driver = *budget;
      for (uint32_t h = 0; h < VK_MAX_MEMORY_HEAPS; ++h) {
        budget->heapBudget[h] = h < 2 ? driver.heapBudget[model.driver_heap[h]] : 0;
        budget->heapUsage[h] = h < 2 ? driver.heapUsage[model.driver_heap[h]] : 0;
      }
    }
}

VKAPI_ATTR VkResult VKAPI_CALL CreateDevice(VkPhysicalDevice physical_device, const VkDeviceCreateInfo* create,
                                            const VkAllocationCallbacks* allocator, VkDevice* out) {
  auto* link = chain_link<VkLayerDeviceCreateInfo>(create->pNext, VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO);
  if (!link) return VK_ERROR_INITIALIZATION_FAILED;
  PFN_vkGetInstanceProcAddr next_instance = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  PFN_vkGetDeviceProcAddr next = link->u.pLayerInfo->pfnNextGetDeviceProcAddr;
  link->u.pLayerInfo = link->u.pLayerInfo->pNext;
  Instance& instance = instance_of(physical_device);
  auto create_next = next_proc<PFN_vkCreateDevice>(next_instance, instance.handle, "vkCreateDevice");
  VkResult result = create_next(physical_device, create, allocator, out);
  if (result != VK_SUCCESS) return result;
  auto device = std::make_unique<Device>();
  device->handle = *out;
  device->instance = &instance;
  device->model = std::make_unique<MemoryModel>(model_of(instance, physical_device));
  device->next = next;
  auto proc = [&](auto& function, const char* name) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(next(*out, name));
  };
  proc(device->destroy, "vkDestroyDevice");
  proc(device->allocate, "vkAllocateMemory");
  proc(device->free, "vkFreeMemory");
  proc(device->map, "vkMapMemory");
  proc(device->unmap, "vkUnmapMemory");
  proc(device->flush, "vkFlushMappedMemoryRanges");
  proc(device->invalidate, "vkInvalidateMappedMemoryRanges");
  proc(device->buffer_requirements, "vkGetBufferMemoryRequirements");
  proc(device->buffer_requirements2, "vkGetBufferMemoryRequirements2");
  proc(device->image_requirements, "vkGetImageMemoryRequirements");
  proc(device->image_requirements2, "vkGetImageMemoryRequirements2");
  proc(device->device_buffer_requirements, "vkGetDeviceBufferMemoryRequirements");
  proc(device->device_image_requirements, "vkGetDeviceImageMemoryRequirements");
  std::lock_guard guard(lock);
  devices[*out] = std::move(device);
  return VK_SUCCESS;
}

// ---- device level ---------------------------------------------------------------------------

VKAPI_ATTR void VKAPI_CALL DestroyDevice(VkDevice handle, const VkAllocationCallbacks* allocator) {
  if (auto device = take(devices, handle)) device->destroy(handle, allocator);
}

VKAPI_ATTR VkResult VKAPI_CALL AllocateMemory(VkDevice handle, const VkMemoryAllocateInfo* info,
                                              const VkAllocationCallbacks* allocator, VkDeviceMemory* out) {
  Device& device = device_of(handle);
  if (info->memoryTypeIndex >= kTypeCount) misuse("vkAllocateMemory of a memory type the layer did not report", "VUID-vkAllocateMemory-pAllocateInfo-01714");
  VkMemoryAllocateInfo driver = *info;
  driver.memoryTypeIndex = device.model->driver_type[info->memoryTypeIndex];
  VkResult result = device.allocate(handle, &driver, allocator, out);
  if (result != VK_SUCCESS) return result;
  std::lock_guard guard(lock);
  device.memories[*out] = {info->memoryTypeIndex, info->allocationSize, nullptr};
  return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL FreeMemory(VkDevice handle, VkDeviceMemory memory, const VkAllocationCallbacks* allocator) {
  Device& device = device_of(handle);
  {
    std::lock_guard guard(lock);
    device.memories.erase(memory);
  }
  device.free(handle, memory, allocator);
}

VKAPI_ATTR VkResult VKAPI_CALL MapMemory(VkDevice handle, VkDeviceMemory memory, VkDeviceSize offset, VkDeviceSize size,
                                         VkMemoryMapFlags flags, void** out) {
  Device& device = device_of(handle);
  std::lock_guard guard(lock);
  Memory& record = device.memories.at(memory);
  if (record.type == kDeviceLocal) {
    std::fprintf(stderr, "VK_LAYER_TESSERA_discrete_gpu: vkMapMemory of device-local memory, which the host cannot map\n");
    return VK_ERROR_MEMORY_MAP_FAILED;
  }
  void* driver = nullptr;
  VkResult result = device.map(handle, memory, offset, size, flags, &driver);
  if (result != VK_SUCCESS || record.type != kHostCached) {
    *out = driver;
    return result;
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->offset = offset;
  mapping->size = size == VK_WHOLE_SIZE ? record.size - offset : size;
  mapping->driver = static_cast<char*>(driver);
  VkDeviceSize bytes = (offset + mapping->size + 4095) / 4096 * 4096;
  mapping->copy.reset(static_cast<char*>(std::aligned_alloc(4096, bytes)));
  if (!mapping->copy) return VK_ERROR_OUT_OF_HOST_MEMORY;
  std::memcpy(mapping->copy.get() + offset, driver, mapping->size);
  *out = mapping->copy.get() + offset;
  record.mapping = std::move(mapping);
  return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL UnmapMemory(VkDevice handle, VkDeviceMemory memory) {
  Device& device = device_of(handle);
  {
    std::lock_guard guard(lock);
    device.memories.at(memory).mapping.reset();  // unflushed writes are lost, as unmapping a cache's lines loses them
  }
  device.unmap(handle, memory);
}

// The bytes of `range` within its mapping; aborts where the range breaks the atom rules.
struct Span {
  Mapping* mapping;
  VkDeviceSize begin, end;  // offsets in the memory
};
Span checked_span(Device& device, const VkMappedMemoryRange& range, const char* call) {
  Memory& record = device.memories.at(range.memory);
  if (record.type == kDeviceLocal) misuse(call, "the memory is not host-visible");
  Mapping* mapping = record.mapping.get();
  if (record.type != kHostCached) return {nullptr, 0, 0};
  if (!mapping) misuse(call, "VUID-VkMappedMemoryRange-memory-00684: the memory is not mapped");
  if (range.offset % kAtom) misuse(call, "VUID-VkMappedMemoryRange-offset-00687: offset is not a multiple of nonCoherentAtomSize");
  VkDeviceSize end = mapping->offset + mapping->size;
  if (range.size != VK_WHOLE_SIZE) {
    if (range.size % kAtom && range.offset + range.size != record.size)
      misuse(call, "VUID-VkMappedMemoryRange-size-01390: size is not a multiple of nonCoherentAtomSize "
                   "and does not end the memory");
    end = range.offset + range.size;
  }
  if (range.offset < mapping->offset || end > mapping->offset + mapping->size)
    misuse(call, "VUID-VkMappedMemoryRange-size-00685: the range is outside the mapping");
  return {mapping, range.offset, end};
}

VKAPI_ATTR VkResult VKAPI_CALL FlushMappedMemoryRanges(VkDevice handle, uint32_t count, const VkMappedMemoryRange* ranges) {
  Device& device = device_of(handle);
  {
    std::lock_guard guard(lock);
    for (uint32_t i = 0; i < count; ++i) {
      Span span = checked_span(device, ranges[i], "vkFlushMappedMemoryRanges");
      if (span.mapping)
        std::memcpy(span.mapping->driver + (span.begin - span.mapping->offset), span.mapping->copy.get() + span.begin,
                    span.end - span.begin);
    }
  }
  return device.flush(handle, count, ranges);
}

VKAPI_ATTR VkResult VKAPI_CALL InvalidateMappedMemoryRanges(VkDevice handle, uint32_t count,
                                                            const VkMappedMemoryRange* ranges) {
  Device& device = device_of(handle);
  VkResult result = device.invalidate(handle, count, ranges);
  if (result != VK_SUCCESS) return result;
  std::lock_guard guard(lock);
  for (uint32_t i = 0; i < count; ++i) {
    Span span = checked_span(device, ranges[i], "vkInvalidateMappedMemoryRanges");
    if (span.mapping)
      std::memcpy(span.mapping->copy.get() + span.begin, span.mapping->driver + (span.begin - span.mapping->offset),
                  span.end - span.begin);
  }
  return VK_SUCCESS;
}

// Every vkGet*MemoryRequirements*: the driver's answer with its types translated to the reported ones.
void report(const Device& device, VkMemoryRequirements* out) {
  out->memoryTypeBits = device.model->reported_bits(out->memoryTypeBits);
}
void report(const Device& device, VkMemoryRequirements2* out) { report(device, &out->memoryRequirements); }

template <auto next, class Of, class Out>
VKAPI_ATTR void VKAPI_CALL MemoryRequirements(VkDevice handle, Of of, Out* out) {
  Device& device = device_of(handle);
  (device.*next)(handle, of, out);
  report(device, out);
}
#define REQUIREMENTS(next, Of, Out) (MemoryRequirements<&Device::next, Of, Out>)

// ---- dispatch -------------------------------------------------------------------------------

struct Entry {
  const char* name;
  PFN_vkVoidFunction function;
};
#define ENTRY(name, function) \
  Entry { name, reinterpret_cast<PFN_vkVoidFunction>(function) }

PFN_vkVoidFunction find(const Entry* begin, const Entry* end, const char* name) {
  for (const Entry* entry = begin; entry != end; ++entry)
    if (std::strcmp(entry->name, name) == 0) return entry->function;
  return nullptr;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL GetDeviceProcAddr(VkDevice device, const char* name);

PFN_vkVoidFunction device_proc(const char* name) {
  static const Entry entries[] = {
      ENTRY("vkGetDeviceProcAddr", GetDeviceProcAddr),
      ENTRY("vkDestroyDevice", DestroyDevice),
      ENTRY("vkAllocateMemory", AllocateMemory),
      ENTRY("vkFreeMemory", FreeMemory),
      ENTRY("vkMapMemory", MapMemory),
      ENTRY("vkUnmapMemory", UnmapMemory),
      ENTRY("vkFlushMappedMemoryRanges", FlushMappedMemoryRanges),
      ENTRY("vkInvalidateMappedMemoryRanges", InvalidateMappedMemoryRanges),
      ENTRY("vkGetBufferMemoryRequirements", REQUIREMENTS(buffer_requirements, VkBuffer, VkMemoryRequirements)),
      ENTRY("vkGetBufferMemoryRequirements2",
            REQUIREMENTS(buffer_requirements2, const VkBufferMemoryRequirementsInfo2*, VkMemoryRequirements2)),
      ENTRY("vkGetBufferMemoryRequirements2KHR",
            REQUIREMENTS(buffer_requirements2, const VkBufferMemoryRequirementsInfo2*, VkMemoryRequirements2)),
      ENTRY("vkGetImageMemoryRequirements", REQUIREMENTS(image_requirements, VkImage, VkMemoryRequirements)),
      ENTRY("vkGetImageMemoryRequirements2",
            REQUIREMENTS(image_requirements2, const VkImageMemoryRequirementsInfo2*, VkMemoryRequirements2)),
      ENTRY("vkGetImageMemoryRequirements2KHR",
            REQUIREMENTS(image_requirements2, const VkImageMemoryRequirementsInfo2*, VkMemoryRequirements2)),
      ENTRY("vkGetDeviceBufferMemoryRequirements",
            REQUIREMENTS(device_buffer_requirements, const VkDeviceBufferMemoryRequirements*, VkMemoryRequirements2)),
      ENTRY("vkGetDeviceBufferMemoryRequirementsKHR",
            REQUIREMENTS(device_buffer_requirements, const VkDeviceBufferMemoryRequirements*, VkMemoryRequirements2)),
      ENTRY("vkGetDeviceImageMemoryRequirements",
            REQUIREMENTS(device_image_requirements, const VkDeviceImageMemoryRequirements*, VkMemoryRequirements2)),
      ENTRY("vkGetDeviceImageMemoryRequirementsKHR",
            REQUIREMENTS(device_image_requirements, const VkDeviceImageMemoryRequirements*, VkMemoryRequirements2)),
  };
  return find(std::begin(entries), std::end(entries), name);
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL GetDeviceProcAddr(VkDevice handle, const char* name) {
  Device& device = device_of(handle);
  PFN_vkVoidFunction next = device.next(handle, name);
  // Only what the driver has: a 1.3 function of a 1.2 device stays null.
  PFN_vkVoidFunction own = device_proc(name);
  return own && next ? own : next;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL GetInstanceProcAddr(VkInstance handle, const char* name) {
  static const Entry entries[] = {
      ENTRY("vkGetInstanceProcAddr", GetInstanceProcAddr),
      ENTRY("vkCreateInstance", CreateInstance),
      ENTRY("vkDestroyInstance", DestroyInstance),
      ENTRY("vkEnumeratePhysicalDevices", EnumeratePhysicalDevices),
      ENTRY("vkEnumeratePhysicalDeviceGroups", EnumeratePhysicalDeviceGroups),
      ENTRY("vkEnumeratePhysicalDeviceGroupsKHR", EnumeratePhysicalDeviceGroups),
      ENTRY("vkGetPhysicalDeviceProperties", GetPhysicalDeviceProperties),
      ENTRY("vkGetPhysicalDeviceProperties2", GetPhysicalDeviceProperties2),
      ENTRY("vkGetPhysicalDeviceProperties2KHR", GetPhysicalDeviceProperties2),
      ENTRY("vkGetPhysicalDeviceMemoryProperties", GetPhysicalDeviceMemoryProperties),
      ENTRY("vkGetPhysicalDeviceMemoryProperties2", GetPhysicalDeviceMemoryProperties2),
      ENTRY("vkGetPhysicalDeviceMemoryProperties2KHR", GetPhysicalDeviceMemoryProperties2),
      ENTRY("vkCreateDevice", CreateDevice),
  };
  if (PFN_vkVoidFunction own = find(std::begin(entries), std::end(entries), name)) return own;
  if (PFN_vkVoidFunction own = device_proc(name)) return own;
  if (!handle) return nullptr;
  PFN_vkGetInstanceProcAddr next;
  {
    std::lock_guard guard(lock);
    auto it = instances.find(handle);
    if (it == instances.end()) return nullptr;
    next = it->second->next;
  }
  return next(handle, name);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) VKAPI_ATTR VkResult VKAPI_CALL
vkNegotiateLoaderLayerInterfaceVersion(VkNegotiateLayerInterface* version) {
  if (version->sType != LAYER_NEGOTIATE_INTERFACE_STRUCT) return VK_ERROR_INITIALIZATION_FAILED;
  version->loaderLayerInterfaceVersion = std::min<uint32_t>(version->loaderLayerInterfaceVersion, 2);
  version->pfnGetInstanceProcAddr = GetInstanceProcAddr;
  version->pfnGetDeviceProcAddr = GetDeviceProcAddr;
  version->pfnGetPhysicalDeviceProcAddr = nullptr;
  return VK_SUCCESS;
}
