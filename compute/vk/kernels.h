// Compute pipelines from the embedded shaders, specialised per device and cached, each checked
// against what its SPIR-V declares.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "compute/vk/kernel_names.h"
#include "compute/vk/memory.h"

namespace tessera::vk {

class Context;
struct DeviceInfo;

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
  // The most bytes one binding reaches (DeviceInfo::largest_buffer): a layer reads a larger
  // input in windows of rows (linear).
  uint64_t largest_binding = uint64_t{1} << 27;
  // GPUs' shared-memory GEMM tiles as set by TESSERA_GEMM_TILES=OUTPUTS,DEPTH[,GROUP] (a tile
  // sweep on a new device: bench/README.md), 0 where gemm_tiles chooses.
  int32_t gemm_outputs = 0, gemm_depth = 0, gemm_group = 0;

  // A CPU, or a device whose subgroups are at most 8 lanes wide (lavapipe, whatever type it is
  // presented as): SIMD lanes of a core, where loads cost far more than FMAs and shared memory is
  // ordinary cached memory, so kernels keep their blocks in registers and their sums in a
  // shared-memory tree (compute/ops/gemm.h, op.h's subgroup_reductions).
  bool cpu_like() const { return device_type == "cpu" || subgroup_size <= 8; }
};

// The target of a device: what its kernels are chosen for, with TESSERA_GEMM_TILES where set
// (a UsageError naming it where it is not three powers of two in range).
TileTarget tile_target_of(const DeviceInfo& device);

// Every kernel takes its buffers through one push-descriptor set (bindings 0..n-1, all
// storage buffers) and its scalars as push constants (at most 128 bytes, the portable limit).
struct Kernel {
  std::string name;
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t binding_count = 0;
  // Per binding: a storage buffer, a uniform texel buffer (a samplerBuffer in GLSL), or a
  // storage texel buffer (a readonly imageBuffer), which the recorder binds to the view of the
  // texels that the shader declares (image_texels; a binding's format is fixed in SPIR-V).
  std::vector<VkDescriptorType> binding_types;
  std::vector<TexelLayout> image_texels;
  // Per binding: a storage buffer of 16-bit floats (an fp16 variant's activations), which the
  // recorder binds only to buffers marked half, and every other storage buffer only to unmarked ones.
  std::vector<bool> half_storage;
  uint32_t push_bytes = 0;  // the size of the shader's push-constant block
};

// The push constants of a kernel that declares none.
struct NoPush {};

// A kernel's pipeline, made for the push-constant struct Push: the recorder dispatches it with a
// Push and nothing else, and Push's size was checked against the SPIR-V's block when it was made.
template <class Push>
class Pipeline {
 public:
  explicit Pipeline(const Kernel& kernel) : kernel_(&kernel) {}
  const Kernel& kernel() const { return *kernel_; }

 private:
  const Kernel* kernel_;
};

class Kernels {
 public:
  explicit Kernels(Context& context);
  ~Kernels();
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  // The pipeline of `source` with specialization constants 0..n-1 set to `constants` (a shader
  // gives its workgroup size and tile shapes this way), for push constants of type Push. Throws
  // naming the kernel when the SPIR-V declares another number of specialization constants or a
  // push-constant block of another size than Push.
  template <class Push = NoPush>
  Pipeline<Push> get(const KernelSource& source, const std::vector<int32_t>& constants = {}) {
    static_assert(std::is_trivially_copyable_v<Push> && sizeof(Push) <= 128,
                  "push constants are trivially copyable and at most 128 bytes");
    return Pipeline<Push>(make(source, constants, std::is_same_v<Push, NoPush> ? 0 : sizeof(Push)));
  }
  // The device the kernels run on.
  Context& context() const { return context_; }
  // What ops choose their tile shapes for: this device, unless set to another target whose
  // shapes also run here (tests run a GPU's shapes on lavapipe this way).
  const TileTarget& tile_target() const { return tile_target_; }
  void set_tile_target(TileTarget target) { tile_target_ = std::move(target); }

 private:
  const Kernel& make(const KernelSource& source, const std::vector<int32_t>& constants, uint32_t push_bytes);
  void load_cache();
  void save_cache();

  Context& context_;
  TileTarget tile_target_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::string cache_path_;
  std::map<std::pair<const ShaderBinary*, std::vector<int32_t>>, std::unique_ptr<Kernel>> kernels_;
  std::map<const ShaderBinary*, VkShaderModule> modules_;
};

}  // namespace tessera::vk
