#include "compute/vk/kernels.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "common/error.h"
#include "compute/vk/context.h"
#include "compute/vk/shader_registry.h"

namespace tessera::vk {

namespace {

constexpr uint32_t kPushConstantBytes = 128;

// Per binding a module declares (bindings 0..n-1): a uniform texel buffer where the variable is
// a sampled buffer image (samplerBuffer), else a storage buffer; and whether that storage
// buffer's array holds 16-bit floats (scalars or vectors).
struct Bindings {
  std::vector<VkDescriptorType> types;
  std::vector<bool> half_storage;
};
Bindings bindings_of(const ShaderBinary& spirv) {
  constexpr uint32_t kOpTypeFloat = 22, kOpTypeVector = 23, kOpTypeImage = 25, kOpTypeSampledImage = 27,
                     kOpTypeRuntimeArray = 29, kOpTypeStruct = 30, kOpTypePointer = 32, kOpVariable = 59,
                     kOpDecorate = 71, kDecorationBinding = 33, kDimBuffer = 5;
  std::map<uint32_t, uint32_t> binding_of, type_of, pointee_of, image_of, element_of, first_member_of;
  std::set<uint32_t> buffer_images, halves;
  for (size_t i = 5; i < spirv.word_count;) {
    const uint32_t* op = spirv.words + i;
    uint32_t word_count = op[0] >> 16, opcode = op[0] & 0xffff;
    if (word_count == 0) break;
    if (opcode == kOpDecorate && word_count >= 4 && op[2] == kDecorationBinding) binding_of[op[1]] = op[3];
    if (opcode == kOpVariable) type_of[op[2]] = op[1];
    if (opcode == kOpTypePointer) pointee_of[op[1]] = op[3];
    if (opcode == kOpTypeSampledImage) image_of[op[1]] = op[2];
    if (opcode == kOpTypeImage && op[3] == kDimBuffer) buffer_images.insert(op[1]);
    if (opcode == kOpTypeFloat && op[2] == 16) halves.insert(op[1]);
    if (opcode == kOpTypeVector && halves.count(op[2])) halves.insert(op[1]);
    if (opcode == kOpTypeRuntimeArray) element_of[op[1]] = op[2];
    if (opcode == kOpTypeStruct && word_count >= 3) first_member_of[op[1]] = op[2];
    i += word_count;
  }
  uint32_t count = 0;
  for (auto& [variable, binding] : binding_of) count = std::max(count, binding + 1);
  Bindings bindings{std::vector<VkDescriptorType>(count, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER),
                    std::vector<bool>(count, false)};
  for (auto& [variable, binding] : binding_of) {
    uint32_t type = pointee_of[type_of[variable]];
    if (image_of.count(type)) type = image_of[type];
    if (buffer_images.count(type)) bindings.types[binding] = VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
    auto member = first_member_of.find(type);
    if (member != first_member_of.end() && element_of.count(member->second))
      bindings.half_storage[binding] = halves.count(element_of[member->second]) > 0;
  }
  return bindings;
}

std::string cache_file(const VkPhysicalDeviceProperties& properties) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path dir = xdg ? std::filesystem::path(xdg)
                              : home ? std::filesystem::path(home) / ".cache"
                                     : std::filesystem::path();
  if (dir.empty()) return {};
  std::string uuid;
  for (uint8_t byte : properties.pipelineCacheUUID) {
    static const char* hex = "0123456789abcdef";
    uuid += hex[byte >> 4];
    uuid += hex[byte & 15];
  }
  return (dir / "tessera" / ("pipelines-" + std::to_string(properties.vendorID) + "-" +
                             std::to_string(properties.deviceID) + "-" + uuid + ".bin"))
      .string();
}

}  // namespace

Kernels::Kernels(Context& context)
    : context_(context),
      tile_target_{context.info().type,
                   context.info().subgroup_size,
                   context.info().max_shared_memory,
                   context.info().max_workgroup_invocations,
                   context.info().max_workgroup_size_x,
                   context.info().subgroup_arithmetic,
                   context.info().cooperative_matrix} {
  load_cache();
}

Kernels::~Kernels() {
  save_cache();
  VkDevice device = context_.device();
  for (auto& [key, kernel] : kernels_) {
    vkDestroyPipeline(device, kernel->pipeline, nullptr);
    vkDestroyPipelineLayout(device, kernel->layout, nullptr);
    vkDestroyDescriptorSetLayout(device, kernel->set_layout, nullptr);
  }
  for (auto& [name, module] : modules_) vkDestroyShaderModule(device, module, nullptr);
  if (cache_) vkDestroyPipelineCache(device, cache_, nullptr);
}

void Kernels::load_cache() {
  cache_path_ = cache_file(context_.properties());
  std::vector<char> data;
  if (!cache_path_.empty()) {
    std::ifstream in(cache_path_, std::ios::binary);
    if (in) data.assign(std::istreambuf_iterator<char>(in), {});
  }
  VkPipelineCacheCreateInfo create{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  create.initialDataSize = data.size();
  create.pInitialData = data.empty() ? nullptr : data.data();
  // A cache from another driver build is rejected by the driver's header check; start empty then.
  if (vkCreatePipelineCache(context_.device(), &create, nullptr, &cache_) != VK_SUCCESS) {
    create.initialDataSize = 0;
    create.pInitialData = nullptr;
    check(vkCreatePipelineCache(context_.device(), &create, nullptr, &cache_), "vkCreatePipelineCache");
  }
}

void Kernels::save_cache() {
  if (cache_path_.empty() || !cache_ || kernels_.empty()) return;
  size_t size = 0;
  if (vkGetPipelineCacheData(context_.device(), cache_, &size, nullptr) != VK_SUCCESS) return;
  std::vector<char> data(size);
  if (vkGetPipelineCacheData(context_.device(), cache_, &size, data.data()) != VK_SUCCESS) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(cache_path_).parent_path(), ec);
  // Write then rename: concurrent trials of a sweep never see half a cache.
  std::string temporary = cache_path_ + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(size));
    if (!out) return;
  }
  std::filesystem::rename(temporary, cache_path_, ec);
}

const Kernel& Kernels::get(const std::string& name, const std::vector<int32_t>& constants) {
  auto key = std::make_pair(name, constants);
  if (auto it = kernels_.find(key); it != kernels_.end()) return *it->second;

  const ShaderBinary* spirv = find_shader(name);
  if (!spirv) throw Error(ExitCode::runtime_error, "no shader named '" + name + "' is embedded");
  VkDevice device = context_.device();
  VkShaderModule& module = modules_[name];
  if (!module) {
    VkShaderModuleCreateInfo create{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    create.codeSize = spirv->word_count * 4;
    create.pCode = spirv->words;
    check(vkCreateShaderModule(device, &create, nullptr, &module), "vkCreateShaderModule");
  }

  auto kernel = std::make_unique<Kernel>();
  kernel->name = name;
  Bindings declared = bindings_of(*spirv);
  kernel->binding_types = std::move(declared.types);
  kernel->half_storage = std::move(declared.half_storage);
  kernel->binding_count = static_cast<uint32_t>(kernel->binding_types.size());
  std::vector<VkDescriptorSetLayoutBinding> bindings(kernel->binding_count);
  for (uint32_t b = 0; b < kernel->binding_count; ++b)
    bindings[b] = {b, kernel->binding_types[b], 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo set{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  set.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  set.bindingCount = kernel->binding_count;
  set.pBindings = bindings.data();
  check(vkCreateDescriptorSetLayout(device, &set, nullptr, &kernel->set_layout), "vkCreateDescriptorSetLayout");

  VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  VkPipelineLayoutCreateInfo layout{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout.setLayoutCount = 1;
  layout.pSetLayouts = &kernel->set_layout;
  layout.pushConstantRangeCount = 1;
  layout.pPushConstantRanges = &push;
  check(vkCreatePipelineLayout(device, &layout, nullptr, &kernel->layout), "vkCreatePipelineLayout");

  std::vector<VkSpecializationMapEntry> entries(constants.size());
  for (uint32_t i = 0; i < constants.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo specialization{static_cast<uint32_t>(entries.size()), entries.data(),
                                      constants.size() * 4, constants.data()};
  VkComputePipelineCreateInfo create{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  create.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  create.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  create.stage.module = module;
  create.stage.pName = "main";
  create.stage.pSpecializationInfo = constants.empty() ? nullptr : &specialization;
  create.layout = kernel->layout;
  check(vkCreateComputePipelines(device, cache_, 1, &create, nullptr, &kernel->pipeline),
        ("vkCreateComputePipelines(" + name + ")").c_str());
  return *kernels_.emplace(key, std::move(kernel)).first->second;
}

}  // namespace tessera::vk
