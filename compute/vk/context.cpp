#include "compute/vk/context.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"
#include "compute/vk/kernels.h"
#include "compute/vk/memory.h"
#include "compute/vk/pipeline_statistics.h"

namespace tessera::vk {

void check(VkResult result, const char* what) {
  if (result == VK_SUCCESS) return;
  if (result == VK_ERROR_OUT_OF_DEVICE_MEMORY || result == VK_ERROR_OUT_OF_HOST_MEMORY)
    throw OutOfDeviceMemory(std::string(what) + ": the device is out of memory (VkResult " +
                            std::to_string(result) + ")");
  throw Error(ExitCode::runtime_error,
              std::string(what) + " failed with VkResult " + std::to_string(result));
}

namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

VkInstance create_instance(bool validation) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "tessera";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo create{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  create.pApplicationInfo = &app;
  const char* layers[] = {kValidationLayer};
  const char* extensions[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
  VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  VkValidationFeaturesEXT features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
  features.enabledValidationFeatureCount = 1;
  features.pEnabledValidationFeatures = enables;
  if (validation) {
    create.enabledLayerCount = 1;
    create.ppEnabledLayerNames = layers;
    create.enabledExtensionCount = 1;
    create.ppEnabledExtensionNames = extensions;
    create.pNext = &features;
  }
  VkInstance instance = VK_NULL_HANDLE;
  VkResult result = vkCreateInstance(&create, nullptr, &instance);
  if (result == VK_ERROR_LAYER_NOT_PRESENT)
    throw Error(ExitCode::runtime_error,
                "TESSERA_VALIDATION=1 but the Khronos validation layer is not installed "
                "(Debian: vulkan-validationlayers)");
  if (result == VK_ERROR_INCOMPATIBLE_DRIVER)
    throw Error(ExitCode::runtime_error,
                "no Vulkan 1.2 driver found (on a machine without a GPU install mesa-vulkan-drivers for "
                "lavapipe; VK_LOADER_DEBUG=error,warn,driver tessera info shows what the Vulkan loader tried)");
  check(result, "vkCreateInstance");
  return instance;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance instance) {
  uint32_t count = 0;
  check(vkEnumeratePhysicalDevices(instance, &count, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devices(count);
  check(vkEnumeratePhysicalDevices(instance, &count, devices.data()), "vkEnumeratePhysicalDevices");
  return devices;
}

const char* type_name(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

DeviceInfo describe(VkPhysicalDevice device, uint32_t index) {
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  subgroup.pNext = &driver;
  VkPhysicalDeviceProperties2 properties{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  properties.pNext = &subgroup;
  vkGetPhysicalDeviceProperties2(device, &properties);

  VkPhysicalDeviceVulkan11Features features11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features features12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  features11.pNext = &features12;
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &features11;
  vkGetPhysicalDeviceFeatures2(device, &features);

  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(device, &memory);

  DeviceInfo info;
  info.index = index;
  info.name = properties.properties.deviceName;
  info.type = type_name(properties.properties.deviceType);
  info.driver = std::string(driver.driverName) + " " + driver.driverInfo;
  info.host_cores = properties.properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ||
                    driver.driverID == VK_DRIVER_ID_MESA_LLVMPIPE;
  if (driver.driverID == VK_DRIVER_ID_MESA_LLVMPIPE) info.kernel_loop_iterations = 65535;
  info.api_version = properties.properties.apiVersion;
  for (uint32_t h = 0; h < memory.memoryHeapCount; ++h)
    info.heaps.push_back({memory.memoryHeaps[h].size,
                          (memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  info.fp16_arithmetic = features12.shaderFloat16;
  info.fp16_storage = features11.storageBuffer16BitAccess;
  info.subgroup_size = subgroup.subgroupSize;
  const auto& limits = properties.properties.limits;
  info.largest_buffer = std::min<uint64_t>(limits.maxStorageBufferRange, 4ull * limits.maxTexelBufferElements);
  info.max_shared_memory = limits.maxComputeSharedMemorySize;
  info.max_workgroup_invocations = limits.maxComputeWorkGroupInvocations;
  info.max_workgroup_size_x = limits.maxComputeWorkGroupSize[0];
  info.subgroup_arithmetic = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                             (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
  uint32_t extension_count = 0;
  vkEnumerateDeviceExtensionProperties(device, nullptr, &extension_count, nullptr);
  std::vector<VkExtensionProperties> extensions(extension_count);
  vkEnumerateDeviceExtensionProperties(device, nullptr, &extension_count, extensions.data());
  // By name: Debian 12's Vulkan headers predate the extension.
  info.cooperative_matrix = std::any_of(extensions.begin(), extensions.end(), [](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, "VK_KHR_cooperative_matrix") == 0;
  });
  info.host_memory_import = std::any_of(extensions.begin(), extensions.end(), [](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) == 0;
  });
  info.pipeline_statistics = std::any_of(extensions.begin(), extensions.end(), [](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, kPipelineStatisticsExtension) == 0;
  });
  if (info.host_memory_import) {
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    VkPhysicalDeviceProperties2 with_host{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    with_host.pNext = &host;
    vkGetPhysicalDeviceProperties2(device, &with_host);
    info.host_import_alignment = host.minImportedHostPointerAlignment;
  }
  return info;
}

struct QueueFamily {
  uint32_t index;
  uint32_t timestamp_bits;  // 0: no timestamps, so no profiling
};

QueueFamily compute_queue_family(VkPhysicalDevice device) {
  uint32_t count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(device, &count, nullptr);
  std::vector<VkQueueFamilyProperties> families(count);
  vkGetPhysicalDeviceQueueFamilyProperties(device, &count, families.data());
  // Prefer a compute queue without graphics: on GPUs that is the asynchronous compute engine.
  for (uint32_t i = 0; i < count; ++i)
    if ((families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(families[i].queueFlags & VK_QUEUE_GRAPHICS_BIT))
      return {i, families[i].timestampValidBits};
  for (uint32_t i = 0; i < count; ++i)
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return {i, families[i].timestampValidBits};
  throw Error(ExitCode::runtime_error, "the Vulkan device has no compute queue");
}

}  // namespace

ContextOptions options_from_environment() {
  ContextOptions options;
  const char* validation = std::getenv("TESSERA_VALIDATION");
  options.validation = validation && std::strcmp(validation, "0") != 0;
  const char* profile = std::getenv("TESSERA_PROFILE");
  options.profile = profile && std::strcmp(profile, "0") != 0;
  const char* statistics = std::getenv("TESSERA_PIPELINE_STATISTICS");
  options.pipeline_statistics = statistics && std::strcmp(statistics, "0") != 0;
  return options;
}

const char* const no_device_message =
    "no Vulkan device found (VK_LOADER_DEBUG=error,warn,driver tessera info shows what the Vulkan loader tried)";

std::vector<DeviceInfo> list_devices() {
  VkInstance instance = create_instance(false);
  std::vector<DeviceInfo> infos;
  auto devices = physical_devices(instance);
  for (uint32_t i = 0; i < devices.size(); ++i) infos.push_back(describe(devices[i], i));
  vkDestroyInstance(instance, nullptr);
  return infos;
}

std::vector<DeviceInfo> named_devices(const std::vector<int>& indices, const std::string& flag) {
  if (indices.empty()) throw UsageError(flag + ": give at least one device index");
  auto devices = list_devices();
  if (devices.empty()) throw Error(ExitCode::runtime_error, no_device_message);
  std::vector<DeviceInfo> named;
  for (int index : indices) {
    if (index < 0 || static_cast<size_t>(index) >= devices.size())
      throw UsageError(flag + ": there is no device " + std::to_string(index) + " (the Vulkan devices are 0 to " +
                       std::to_string(devices.size() - 1) + ", see `tessera info`)");
    const DeviceInfo& device = devices[static_cast<size_t>(index)];
    for (const DeviceInfo& earlier : named)
      if (earlier.index == device.index && !device.host_cores)
        throw UsageError(flag + ": device " + std::to_string(index) + " (" + device.name +
                         ") is given twice; a GPU is opened once");
    named.push_back(device);
  }
  return named;
}

VKAPI_ATTR VkBool32 VKAPI_CALL Context::on_validation_message(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
    const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  if (severity < VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) return VK_FALSE;
  static_cast<Context*>(user)->validation_messages_++;
  std::fprintf(stderr, "vulkan validation: %s\n", data->pMessage);
  return VK_FALSE;
}

Context::Context(ContextOptions options) {
  instance_ = create_instance(options.validation);
  if (options.validation) {
    VkDebugUtilsMessengerCreateInfoEXT messenger{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    messenger.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                                VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    messenger.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                            VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                            VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    messenger.pfnUserCallback = on_validation_message;
    messenger.pUserData = this;
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    check(create(instance_, &messenger, nullptr, &messenger_), "vkCreateDebugUtilsMessengerEXT");
  }

  auto devices = physical_devices(instance_);
  if (devices.empty()) {
    destroy_instance();
    throw Error(ExitCode::runtime_error, no_device_message);
  }
  uint32_t chosen = 0;
  if (options.device_index >= 0) {
    if (static_cast<size_t>(options.device_index) >= devices.size()) {
      auto count = devices.size();
      destroy_instance();
      throw UsageError("--device " + std::to_string(options.device_index) + ": there are only " +
                       std::to_string(count) + " Vulkan devices (see `tessera info`)");
    }
    chosen = static_cast<uint32_t>(options.device_index);
  } else {
    for (uint32_t i = 0; i < devices.size(); ++i) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(devices[i], &p);
      if (p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU) {
        chosen = i;
        break;
      }
    }
  }
  physical_device_ = devices[chosen];
  info_ = describe(physical_device_, chosen);
  vkGetPhysicalDeviceProperties(physical_device_, &properties_);
  QueueFamily family = compute_queue_family(physical_device_);
  queue_family_ = family.index;
  if (options.profile && family.timestamp_bits == 0)
    throw UsageError("TESSERA_PROFILE: the compute queue of " + info_.name + " has no timestamps");
  profiling_ = options.profile;

  float priority = 1.0f;
  VkDeviceQueueCreateInfo queue{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue.queueFamilyIndex = queue_family_;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkPhysicalDeviceVulkan11Features features11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features features12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  features11.pNext = &features12;
  features11.storageBuffer16BitAccess = info_.fp16_storage;
  features12.shaderFloat16 = info_.fp16_arithmetic;
  std::vector<const char*> extensions{VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
  if (info_.host_memory_import) extensions.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR executable_statistics{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  if (options.pipeline_statistics && !info_.pipeline_statistics)
    std::fprintf(stderr, "TESSERA_PIPELINE_STATISTICS: %s does not offer %s; no statistics\n", info_.name.c_str(),
                 kPipelineStatisticsExtension);
  pipeline_statistics_ = options.pipeline_statistics && info_.pipeline_statistics;
  if (pipeline_statistics_) {
    extensions.push_back(kPipelineStatisticsExtension);
    executable_statistics.pipelineExecutableInfo = VK_TRUE;
    features12.pNext = &executable_statistics;
  }
  VkDeviceCreateInfo create{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  create.pNext = &features11;
  create.queueCreateInfoCount = 1;
  create.pQueueCreateInfos = &queue;
  create.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  create.ppEnabledExtensionNames = extensions.data();
  check(vkCreateDevice(physical_device_, &create, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  push_descriptor_set_ = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(
      vkGetDeviceProcAddr(device_, "vkCmdPushDescriptorSetKHR"));

  VkCommandPoolCreateInfo pool{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = queue_family_;
  check(vkCreateCommandPool(device_, &pool, nullptr, &command_pool_), "vkCreateCommandPool");

  allocator_ = std::make_unique<Allocator>(*this, options.memory_budget);
  kernels_ = std::make_unique<Kernels>(*this);
}

Context::~Context() {
  if (device_) vkDeviceWaitIdle(device_);
  if (profiling_) std::fprintf(stderr, "%s\n", profile_.report(info_.name).dump().c_str());
  kernels_.reset();
  allocator_.reset();
  if (command_pool_) vkDestroyCommandPool(device_, command_pool_, nullptr);
  if (device_) vkDestroyDevice(device_, nullptr);
  destroy_instance();
}

void Context::destroy_instance() {
  if (messenger_) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    destroy(instance_, messenger_, nullptr);
    messenger_ = VK_NULL_HANDLE;
  }
  if (instance_) vkDestroyInstance(instance_, nullptr);
  instance_ = VK_NULL_HANDLE;
}

}  // namespace tessera::vk
