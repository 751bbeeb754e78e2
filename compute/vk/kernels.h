// Compute pipelines from the embedded shaders, specialised per device and cached.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tessera::vk {

class Context;

// What kernel variants and tile shapes are chosen for (compute/ops/gemm.h): a device's
// properties (DeviceInfo), never its name. Where left out, Vulkan's guaranteed minimums.
struct TileTarget {
  std::string device_type;  // DeviceInfo::type
  uint32_t subgroup_size;
  uint32_t max_shared_memory = 16384;  // bytes per workgroup
  uint32_t max_workgroup_invocations = 128;
  uint32_t max_workgroup_size_x = 128;
  bool subgroup_arithmetic = false;
  bool cooperative_matrix = false;  // VK_KHR_cooperative_matrix is offered

  // A CPU, or a device whose subgroups are at most 8 lanes wide (lavapipe, whatever type it is
  // presented as): SIMD lanes of a core, where loads cost far more than FMAs and shared memory is
  // ordinary cached memory, so kernels keep their blocks in registers and their sums in a
  // shared-memory tree (compute/ops/gemm.h, op.h's subgroup_reductions).
  bool cpu_like() const { return device_type == "cpu" || subgroup_size <= 8; }
};

// Every kernel takes its buffers through one push-descriptor set (bindings 0..n-1, all
// storage buffers) and its scalars as push constants (at most 128 bytes, the portable limit).
struct Kernel {
  std::string name;
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t binding_count = 0;
  // Per binding: a storage buffer, or a uniform texel buffer (a samplerBuffer in GLSL).
  std::vector<VkDescriptorType> binding_types;
  // Per binding: a storage buffer of 16-bit floats (an fp16 variant's activations), which the
  // recorder binds only to buffers marked half, and every other storage buffer only to unmarked ones.
  std::vector<bool> half_storage;
};

class Kernels {
 public:
  explicit Kernels(Context& context);
  ~Kernels();
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  // The pipeline of shaders/<name>.comp with specialization constants 0..n-1 set to
  // `constants` (a shader gives its workgroup size and tile shapes this way).
  const Kernel& get(const std::string& name, const std::vector<int32_t>& constants = {});
  // The device the kernels run on.
  Context& context() const { return context_; }
  // What ops choose their tile shapes for: this device, unless set to another target whose
  // shapes also run here (tests run a GPU's shapes on lavapipe this way).
  const TileTarget& tile_target() const { return tile_target_; }
  void set_tile_target(TileTarget target) { tile_target_ = std::move(target); }

 private:
  void load_cache();
  void save_cache();

  Context& context_;
  TileTarget tile_target_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::string cache_path_;
  std::map<std::pair<std::string, std::vector<int32_t>>, std::unique_ptr<Kernel>> kernels_;
  std::map<std::string, VkShaderModule> modules_;
};

}  // namespace tessera::vk
