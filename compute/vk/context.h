// Vulkan instance, device choice and the compute queue.
#pragma once
#include <vulkan/vulkan.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compute/vk/profile.h"

namespace tessera::vk {

class Allocator;
class Kernels;

struct MemoryHeapInfo {
  uint64_t size;
  bool device_local;
};

struct DeviceInfo {
  uint32_t index;
  std::string name;
  std::string type;  // "discrete-gpu", "integrated-gpu", "virtual-gpu", "cpu", "other"
  std::string driver;
  // lavapipe (whatever type a layer presents it as): it computes on the host's cores, so it
  // may be opened more than once (--devices 0,0).
  bool host_cores = false;
  // The iterations all the loops of one kernel invocation may make together, 0 for no bound:
  // llvmpipe's compiler ends them at 65,535 (gallivm's loop limiter), silently, so a kernel that
  // loops over more than that computes a wrong answer there.
  uint32_t kernel_loop_iterations = 0;
  uint32_t api_version;
  std::vector<MemoryHeapInfo> heaps;
  bool fp16_arithmetic;
  bool fp16_storage;
  uint32_t subgroup_size;
  // The largest buffer a kernel can bind: within the storage-buffer range and, since kernels
  // also read buffers as float texels, within the texel-buffer limit.
  uint64_t largest_buffer;
  // What kernel variants are chosen from (vk::TileTarget): a workgroup's shared memory in bytes,
  // its invocations and x size, subgroup arithmetic (subgroupAdd) in compute shaders, and
  // whether VK_KHR_cooperative_matrix is offered.
  uint32_t max_shared_memory;
  uint32_t max_workgroup_invocations;
  uint32_t max_workgroup_size_x;
  bool subgroup_arithmetic;
  bool cooperative_matrix;
  // VK_EXT_external_memory_host: buffers over the host's own memory (streamed weights, which then
  // take none of the device's heap), with its pointer alignment.
  bool host_memory_import = false;
  uint64_t host_import_alignment = 0;
  // VK_KHR_pipeline_executable_properties: the compiler's statistics of each pipeline.
  bool pipeline_statistics = false;
};

// Throws on Vulkan errors with the call that failed; VK_ERROR_OUT_OF_*_MEMORY becomes
// OutOfDeviceMemory (exit 3).
void check(VkResult result, const char* what);

// Every Vulkan device the loader finds, in the loader's order (the order --device counts in).
std::vector<DeviceInfo> list_devices();
// The error text where list_devices() finds none.
extern const char* const no_device_message;

// The devices a list flag names (`--devices 0,1`), in its order. Throws UsageError naming `flag`
// for an empty list, an index that does not exist, or a GPU given twice; lavapipe (host_cores)
// may be given more than once: opened twice, it stands in for two devices.
std::vector<DeviceInfo> named_devices(const std::vector<int>& indices, const std::string& flag);

struct ContextOptions {
  int device_index = -1;        // -1: the first discrete GPU, else the first device
  uint64_t memory_budget = 0;   // 0: what the device reports
  // Khronos validation (with synchronization validation); on when TESSERA_VALIDATION=1.
  bool validation = false;
  // Device time per kernel (see profile.h); on when TESSERA_PROFILE=1.
  bool profile = false;
  // Each pipeline's compiler statistics as a JSON line on stderr (pipeline_statistics.h), where
  // the device offers them; on when TESSERA_PIPELINE_STATISTICS=1.
  bool pipeline_statistics = false;
};

ContextOptions options_from_environment();

class Context {
 public:
  explicit Context(ContextOptions options = options_from_environment());
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  VkDevice device() const { return device_; }
  VkPhysicalDevice physical_device() const { return physical_device_; }
  VkQueue queue() const { return queue_; }
  VkCommandPool command_pool() const { return command_pool_; }
  const DeviceInfo& info() const { return info_; }
  const VkPhysicalDeviceProperties& properties() const { return properties_; }
  Allocator& allocator() { return *allocator_; }
  Kernels& kernels() { return *kernels_; }
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_set() const { return push_descriptor_set_; }
  // Whether pipelines are made with their statistics captured (ContextOptions::pipeline_statistics).
  bool pipeline_statistics() const { return pipeline_statistics_; }

  // Messages the validation layer reported (warnings and errors); tests require zero.
  uint64_t validation_messages() const { return validation_messages_.load(); }
  // Where profiled Programs add their kernels' device time; profiling() says whether they do.
  bool profiling() const { return profiling_; }
  Profile& profile() { return profile_; }

 private:
  static VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(
      VkDebugUtilsMessageSeverityFlagBitsEXT, VkDebugUtilsMessageTypeFlagsEXT,
      const VkDebugUtilsMessengerCallbackDataEXT*, void*);
  void destroy_instance();

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_device_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  DeviceInfo info_;
  VkPhysicalDeviceProperties properties_{};
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_set_ = nullptr;
  std::atomic<uint64_t> validation_messages_{0};
  bool profiling_ = false;
  bool pipeline_statistics_ = false;
  Profile profile_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Kernels> kernels_;
};

}  // namespace tessera::vk
