#include "compute/vk/loader_report.h"

#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "compute/vk/context.h"

namespace tessera::vk {

namespace {

namespace fs = std::filesystem;

std::vector<std::string> split_paths(const char* list) {
  std::vector<std::string> paths;
  std::stringstream text(list ? list : "");
  for (std::string path; std::getline(text, path, ':');)
    if (!path.empty()) paths.push_back(path);
  return paths;
}

std::string environment(const char* name, const char* unset = "") {
  const char* value = std::getenv(name);
  return value && *value ? value : unset;
}

// The loader's search order on Linux (loader/loader.c, "Linux Driver Discovery").
std::vector<std::string> standard_folders() {
  std::vector<std::string> folders;
  const std::string home = environment("HOME");
  const std::string config = environment("XDG_CONFIG_HOME");
  folders.push_back(config.empty() ? home + "/.config" : config);
  for (const std::string& dir : split_paths(environment("XDG_CONFIG_DIRS", "/etc/xdg").c_str()))
    folders.push_back(dir);
  folders.push_back("/etc");
  const std::string data = environment("XDG_DATA_HOME");
  folders.push_back(data.empty() ? home + "/.local/share" : data);
  for (const std::string& dir : split_paths(environment("XDG_DATA_DIRS", "/usr/local/share:/usr/share").c_str()))
    folders.push_back(dir);
  for (std::string& folder : folders) folder += "/vulkan/icd.d";
  return folders;
}

// A path the loader was given: a file, or a folder of .json files (sorted, as listed).
void add_manifests(const std::string& path, bool named, std::vector<DriverManifest>& manifests) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    std::vector<std::string> files;
    for (auto& entry : fs::directory_iterator(path, error))
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    for (auto& file : files) add_manifests(file, true, manifests);
    return;
  }
  if (!named && !fs::exists(path, error)) return;  // a standard folder that is not there
  DriverManifest manifest{path};
  std::ifstream in(path);
  if (!in) {
    manifest.problem = "no such file";
  } else {
    try {
      nlohmann::json json = nlohmann::json::parse(in);
      const nlohmann::json& icd = json.at("ICD");
      manifest.library = icd.at("library_path").get<std::string>();
      manifest.api_version = icd.value("api_version", "");
      manifest.readable = true;
    } catch (const std::exception& e) {
      manifest.problem = std::string("not an ICD manifest: ") + e.what();
    }
  }
  manifests.push_back(std::move(manifest));
}

}  // namespace

std::string version_text(uint32_t version) {
  return std::to_string(VK_API_VERSION_MAJOR(version)) + "." + std::to_string(VK_API_VERSION_MINOR(version)) + "." +
         std::to_string(VK_API_VERSION_PATCH(version));
}

std::string loader_version() {
  uint32_t version = VK_API_VERSION_1_0;
  auto enumerate =
      reinterpret_cast<PFN_vkEnumerateInstanceVersion>(vkGetInstanceProcAddr(nullptr, "vkEnumerateInstanceVersion"));
  if (enumerate) enumerate(&version);  // a 1.0 loader has none
  return version_text(version);
}

std::string driver_override() {
  for (const char* name : {"VK_DRIVER_FILES", "VK_ICD_FILENAMES"})
    if (!environment(name).empty()) return name;
  return "";
}

std::vector<DriverManifest> driver_manifests() {
  std::vector<DriverManifest> manifests;
  const std::string replaced = driver_override();
  if (!replaced.empty()) {
    for (const std::string& path : split_paths(std::getenv(replaced.c_str()))) add_manifests(path, true, manifests);
    return manifests;
  }
  for (const std::string& path : split_paths(std::getenv("VK_ADD_DRIVER_FILES"))) add_manifests(path, true, manifests);
  for (const std::string& folder : standard_folders()) add_manifests(folder, false, manifests);
  return manifests;
}

std::vector<DeviceLimits> device_limits() {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "tessera doctor";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo create{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  create.pApplicationInfo = &app;
  VkInstance instance = VK_NULL_HANDLE;
  check(vkCreateInstance(&create, nullptr, &instance), "vkCreateInstance");
  uint32_t count = 0;
  vkEnumeratePhysicalDevices(instance, &count, nullptr);
  std::vector<VkPhysicalDevice> devices(count);
  vkEnumeratePhysicalDevices(instance, &count, devices.data());
  std::vector<DeviceLimits> all;
  for (VkPhysicalDevice device : devices) {
    VkPhysicalDeviceProperties properties;
    vkGetPhysicalDeviceProperties(device, &properties);
    VkPhysicalDeviceMemoryProperties memory;
    vkGetPhysicalDeviceMemoryProperties(device, &memory);
    DeviceLimits limits{{},
                        properties.limits.maxStorageBufferRange,
                        properties.limits.maxTexelBufferElements,
                        properties.limits.nonCoherentAtomSize,
                        properties.limits.maxPushConstantsSize,
                        properties.limits.maxComputeWorkGroupCount[0]};
    for (uint32_t t = 0; t < memory.memoryTypeCount; ++t) {
      const VkMemoryPropertyFlags flags = memory.memoryTypes[t].propertyFlags;
      limits.memory_types.push_back({memory.memoryTypes[t].heapIndex, (flags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) != 0,
                                     (flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0,
                                     (flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0,
                                     (flags & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) != 0});
    }
    all.push_back(std::move(limits));
  }
  vkDestroyInstance(instance, nullptr);
  return all;
}

}  // namespace tessera::vk
