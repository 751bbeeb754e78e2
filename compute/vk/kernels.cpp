#include "compute/vk/kernels.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>

#include "common/error.h"
#include "compute/vk/context.h"
#include "compute/vk/pipeline_statistics.h"

namespace tessera::vk {

namespace {

// What a module declares: per binding (0..n-1) a uniform texel buffer where the variable is a
// sampled buffer image (samplerBuffer), a storage texel buffer where it is a storage one
// (imageBuffer) with the texels of its format, else a storage buffer, and whether that storage
// buffer's array holds 16-bit floats (scalars or vectors); the size of its push-constant block;
// the number of specialization constants it reads (the highest SpecId + 1).
struct Reflection {
  std::vector<VkDescriptorType> types;
  std::vector<TexelLayout> image_texels;
  std::vector<bool> half_storage;
  uint32_t push_bytes = 0;
  uint32_t specialization_constants = 0;
};
// A storage texel buffer's SPIR-V image format as the texels of a Buffer view: the four that
// Buffer::texel_view makes.
TexelLayout texel_layout_of(uint32_t image_format, uint32_t binding) {
  constexpr uint32_t kRgba32f = 1, kRgba16f = 2, kR32f = 3, kR16f = 9;
  switch (image_format) {
    case kRgba32f: return {false, true};
    case kRgba16f: return {true, true};
    case kR32f: return {false, false};
    case kR16f: return {true, false};
  }
  throw std::logic_error("binding " + std::to_string(binding) + ": an imageBuffer of SPIR-V format " +
                         std::to_string(image_format) + ", none of r32f, r16f, rgba32f, rgba16f");
}

Reflection reflect(const ShaderBinary& spirv) {
  constexpr uint32_t kOpTypeInt = 21, kOpTypeFloat = 22, kOpTypeVector = 23, kOpTypeImage = 25,
                     kOpTypeSampledImage = 27, kOpTypeArray = 28, kOpTypeRuntimeArray = 29, kOpTypeStruct = 30,
                     kOpTypePointer = 32, kOpConstant = 43, kOpVariable = 59, kOpDecorate = 71,
                     kOpMemberDecorate = 72, kDecorationSpecId = 1, kDecorationArrayStride = 6,
                     kDecorationBinding = 33, kDecorationOffset = 35, kDimBuffer = 5, kStoragePushConstant = 9,
                     kStorageImage = 2;
  std::map<uint32_t, uint32_t> binding_of, type_of, pointee_of, image_of, element_of, first_member_of, scalar_bytes,
      constant_value, array_stride;
  std::map<uint32_t, std::pair<uint32_t, uint32_t>> vector_of, array_of;  // (element, count or length id)
  std::map<uint32_t, std::vector<uint32_t>> members_of;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> member_offset;
  std::set<uint32_t> buffer_images, halves;
  std::map<uint32_t, uint32_t> storage_image_format;
  uint32_t push_variable_type = 0, specialization_constants = 0;
  for (size_t i = 5; i < spirv.word_count;) {
    const uint32_t* op = spirv.words + i;
    uint32_t word_count = op[0] >> 16, opcode = op[0] & 0xffff;
    if (word_count == 0) break;
    if (opcode == kOpDecorate && word_count >= 4 && op[2] == kDecorationBinding) binding_of[op[1]] = op[3];
    if (opcode == kOpDecorate && word_count >= 4 && op[2] == kDecorationSpecId)
      specialization_constants = std::max(specialization_constants, op[3] + 1);
    if (opcode == kOpDecorate && word_count >= 4 && op[2] == kDecorationArrayStride) array_stride[op[1]] = op[3];
    if (opcode == kOpMemberDecorate && word_count >= 5 && op[3] == kDecorationOffset) member_offset[{op[1], op[2]}] = op[4];
    if (opcode == kOpVariable) {
      type_of[op[2]] = op[1];
      if (op[3] == kStoragePushConstant) push_variable_type = op[1];
    }
    if (opcode == kOpTypePointer) pointee_of[op[1]] = op[3];
    if (opcode == kOpTypeSampledImage) image_of[op[1]] = op[2];
    if (opcode == kOpTypeImage && op[3] == kDimBuffer) {
      if (op[7] == kStorageImage) storage_image_format[op[1]] = op[8];
      else buffer_images.insert(op[1]);
    }
    if (opcode == kOpTypeInt || opcode == kOpTypeFloat) scalar_bytes[op[1]] = op[2] / 8;
    if (opcode == kOpTypeFloat && op[2] == 16) halves.insert(op[1]);
    if (opcode == kOpTypeVector) {
      vector_of[op[1]] = {op[2], op[3]};
      if (halves.count(op[2])) halves.insert(op[1]);
    }
    if (opcode == kOpTypeArray) array_of[op[1]] = {op[2], op[3]};
    if (opcode == kOpConstant && word_count >= 4) constant_value[op[2]] = op[3];
    if (opcode == kOpTypeRuntimeArray) element_of[op[1]] = op[2];
    if (opcode == kOpTypeStruct) {
      members_of[op[1]].assign(op + 2, op + word_count);
      if (word_count >= 3) first_member_of[op[1]] = op[2];
    }
    i += word_count;
  }
  uint32_t count = 0;
  for (auto& [variable, binding] : binding_of) count = std::max(count, binding + 1);
  Reflection reflection{std::vector<VkDescriptorType>(count, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER),
                        std::vector<TexelLayout>(count), std::vector<bool>(count, false), 0, specialization_constants};
  for (auto& [variable, binding] : binding_of) {
    uint32_t type = pointee_of[type_of[variable]];
    if (image_of.count(type)) type = image_of[type];
    if (buffer_images.count(type)) reflection.types[binding] = VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
    if (auto image = storage_image_format.find(type); image != storage_image_format.end()) {
      reflection.types[binding] = VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER;
      reflection.image_texels[binding] = texel_layout_of(image->second, binding);
    }
    auto member = first_member_of.find(type);
    if (member != first_member_of.end() && element_of.count(member->second))
      reflection.half_storage[binding] = halves.count(element_of[member->second]) > 0;
  }
  // The push-constant block: its last byte, over members of scalars, vectors and arrays of them.
  std::function<uint32_t(uint32_t)> bytes_of = [&](uint32_t type) -> uint32_t {
    if (auto scalar = scalar_bytes.find(type); scalar != scalar_bytes.end()) return scalar->second;
    if (auto vector = vector_of.find(type); vector != vector_of.end())
      return vector->second.second * bytes_of(vector->second.first);
    if (auto array = array_of.find(type); array != array_of.end())
      return constant_value[array->second.second] * array_stride[type];
    return 0;
  };
  if (push_variable_type) {
    uint32_t block = pointee_of[push_variable_type];
    auto& members = members_of[block];
    for (uint32_t m = 0; m < members.size(); ++m)
      reflection.push_bytes = std::max(reflection.push_bytes, member_offset[{block, m}] + bytes_of(members[m]));
  }
  return reflection;
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

namespace {
// TESSERA_GEMM_TILES=OUTPUTS,DEPTH[,GROUP]: outputs a side per invocation (1-8), reduction steps
// per slice (4-32), invocations per workgroup (32-1024); each a power of two.
void set_gemm_tiles(TileTarget& target, const char* text) {
  std::vector<int32_t> values;
  std::string field;
  for (const char* c = text;; ++c) {
    if (*c == ',' || *c == 0) {
      bool digits = !field.empty() && field.size() < 6 && field.find_first_not_of("0123456789") == std::string::npos;
      values.push_back(digits ? std::stoi(field) : -1);
      field.clear();
      if (*c == 0) break;
    } else {
      field += *c;
    }
  }
  auto power_within = [](int32_t v, int32_t low, int32_t high) { return v >= low && v <= high && (v & (v - 1)) == 0; };
  bool valid = (values.size() == 2 || values.size() == 3) && power_within(values[0], 1, 8) &&
               power_within(values[1], 4, 32) && (values.size() == 2 || power_within(values[2], 32, 1024));
  if (!valid)
    throw UsageError(std::string("TESSERA_GEMM_TILES=") + text +
                     ": give OUTPUTS,DEPTH[,GROUP], powers of two: outputs 1-8, depth 4-32, group 32-1024");
  target.gemm_outputs = values[0];
  target.gemm_depth = values[1];
  target.gemm_group = values.size() == 3 ? values[2] : 0;
}
}  // namespace

TileTarget tile_target_of(const DeviceInfo& device) {
  TileTarget target{device.type,
                    device.subgroup_size,
                    device.max_shared_memory,
                    device.max_workgroup_invocations,
                    device.max_workgroup_size_x,
                    device.subgroup_arithmetic,
                    device.cooperative_matrix,
                    device.largest_buffer};
  if (const char* tiles = std::getenv("TESSERA_GEMM_TILES"); tiles && *tiles) set_gemm_tiles(target, tiles);
  return target;
}

Kernels::Kernels(Context& context) : context_(context), tile_target_(tile_target_of(context.info())) { load_cache(); }

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

const Kernel& Kernels::make(const KernelSource& source, const std::vector<int32_t>& constants, uint32_t push_bytes) {
  const ShaderBinary* spirv = source.spirv;
  std::string name(source.name);
  auto key = std::make_pair(spirv, constants);
  auto found = kernels_.find(key);
  // The push-constant size is checked for every caller: a pipeline is shared by the callers that
  // give the same constants.
  if (found != kernels_.end() && found->second->push_bytes == push_bytes) return *found->second;
  Reflection declared = reflect(*spirv);
  if (declared.specialization_constants != constants.size())
    throw Error(ExitCode::runtime_error, "kernel " + name + ": shaders/" + name + " reads " +
                                             std::to_string(declared.specialization_constants) +
                                             " specialization constants, the pipeline is made with " +
                                             std::to_string(constants.size()));
  if (declared.push_bytes != push_bytes)
    throw Error(ExitCode::runtime_error, "kernel " + name + ": shaders/" + name + " declares a push-constant block of " +
                                             std::to_string(declared.push_bytes) + " bytes, the pipeline is made for " +
                                             std::to_string(push_bytes));
  VkDevice device = context_.device();
  VkShaderModule& module = modules_[spirv];
  if (!module) {
    VkShaderModuleCreateInfo create{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    create.codeSize = spirv->word_count * 4;
    create.pCode = spirv->words;
    check(vkCreateShaderModule(device, &create, nullptr, &module), "vkCreateShaderModule");
  }

  auto kernel = std::make_unique<Kernel>();
  kernel->name = name;
  kernel->binding_types = std::move(declared.types);
  kernel->image_texels = std::move(declared.image_texels);
  kernel->half_storage = std::move(declared.half_storage);
  kernel->push_bytes = push_bytes;
  kernel->binding_count = static_cast<uint32_t>(kernel->binding_types.size());
  std::vector<VkDescriptorSetLayoutBinding> bindings(kernel->binding_count);
  for (uint32_t b = 0; b < kernel->binding_count; ++b)
    bindings[b] = {b, kernel->binding_types[b], 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo set{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  set.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  set.bindingCount = kernel->binding_count;
  set.pBindings = bindings.data();
  check(vkCreateDescriptorSetLayout(device, &set, nullptr, &kernel->set_layout), "vkCreateDescriptorSetLayout");

  VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo layout{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout.setLayoutCount = 1;
  layout.pSetLayouts = &kernel->set_layout;
  layout.pushConstantRangeCount = push_bytes ? 1 : 0;
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
  if (context_.pipeline_statistics()) create.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  check(vkCreateComputePipelines(device, cache_, 1, &create, nullptr, &kernel->pipeline),
        ("vkCreateComputePipelines(" + name + ")").c_str());
  if (context_.pipeline_statistics()) {
    nlohmann::json line = pipeline_statistics(device, kernel->pipeline);
    line["event"] = "pipeline_statistics";
    line["kernel"] = name;
    line["constants"] = constants;
    std::fprintf(stderr, "%s\n", line.dump().c_str());
  }
  return *kernels_.emplace(key, std::move(kernel)).first->second;
}

}  // namespace tessera::vk
