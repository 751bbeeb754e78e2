// What `tessera doctor` says of the Vulkan side beyond DeviceInfo: the loader's version, the
// driver manifests (ICDs) it reads, and each device's memory types and raw limits. Read with an
// instance of its own and no layer of tessera's (the layers the environment adds still apply,
// as they do to every command).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::vk {

// A Vulkan version number as text ("1.3.239").
std::string version_text(uint32_t version);

// The loader's Vulkan version ("1.3.239"), from vkEnumerateInstanceVersion.
std::string loader_version();

struct DriverManifest {
  std::string path;          // the .json file
  bool readable = false;     // it exists and parses as an ICD manifest
  std::string library;       // ICD.library_path
  std::string api_version;   // ICD.api_version
  std::string problem;       // why not readable
};

// The manifests the loader reads, as it finds them: VK_DRIVER_FILES (or the older
// VK_ICD_FILENAMES) alone where set, else the standard folders (XDG and /etc, /usr/share, ...)
// and VK_ADD_DRIVER_FILES. A folder named stands for the .json files in it.
std::vector<DriverManifest> driver_manifests();
// Whether the environment replaces the standard folders (VK_DRIVER_FILES or VK_ICD_FILENAMES).
std::string driver_override();

struct MemoryTypeInfo {
  uint32_t heap;
  bool device_local, host_visible, host_coherent, host_cached;
};

struct DeviceLimits {
  std::vector<MemoryTypeInfo> memory_types;
  uint64_t max_storage_buffer_range;
  uint64_t max_texel_buffer_elements;
  uint64_t non_coherent_atom_size;
  uint32_t max_push_constants_size;
  uint32_t max_compute_workgroup_count_x;
};

// Each device's memory types and limits, in the loader's order (DeviceInfo::index).
std::vector<DeviceLimits> device_limits();

}  // namespace tessera::vk
