// tessera info: the Vulkan devices and the library versions.
#include <cstdio>
#include <memory>

#include <H5public.h>
#include <lmdb.h>
#include <nlohmann/json.hpp>
#include <openslide/openslide.h>
#include <sqlite3.h>
#include <tiffvers.h>

#include "common/error.h"
#include "common/units.h"
#include "compute/vk/context.h"
#include "compute/vk/loader_report.h"
#include "common/progress.h"
#include "tools/commands.h"

namespace tessera::cli {

using vk::version_text;

void add_info_command(CLI::App& app) {
  auto* command = app.add_subcommand("info", "List Vulkan devices and library versions");
  // tessera's --json (which may follow the command): one JSON object instead of text.
  command->callback([] {
    auto devices = vk::list_devices();
    if (devices.empty()) throw Error(ExitCode::runtime_error, vk::no_device_message);
    unsigned h5_major, h5_minor, h5_release;
    H5get_libversion(&h5_major, &h5_minor, &h5_release);
    nlohmann::json libraries = {
        {"vulkan-headers", version_text(VK_HEADER_VERSION_COMPLETE)},
        {"hdf5", std::to_string(h5_major) + "." + std::to_string(h5_minor) + "." + std::to_string(h5_release)},
        {"lmdb", MDB_VERSION_STRING},
        {"sqlite", sqlite3_libversion()},
        {"openslide", openslide_get_version()},
        {"libtiff", std::to_string(TIFFLIB_VERSION)},
    };
    if (Progress::json()) {
      nlohmann::json out = {{"devices", nlohmann::json::array()}, {"libraries", libraries}};
      for (auto& d : devices) {
        nlohmann::json heaps = nlohmann::json::array();
        for (auto& h : d.heaps) heaps.push_back({{"bytes", h.size}, {"device_local", h.device_local}});
        out["devices"].push_back({{"index", d.index}, {"name", d.name}, {"type", d.type},
                                  {"driver", d.driver}, {"api", version_text(d.api_version)},
                                  {"heaps", heaps}, {"fp16_arithmetic", d.fp16_arithmetic},
                                  {"fp16_storage", d.fp16_storage}, {"subgroup_size", d.subgroup_size},
                                  {"largest_buffer", d.largest_buffer}});
      }
      std::printf("%s\n", out.dump(2).c_str());
      return;
    }
    for (auto& d : devices) {
      std::printf("device %u: %s (%s, Vulkan %s, %s)\n", d.index, d.name.c_str(), d.type.c_str(),
                  version_text(d.api_version).c_str(), d.driver.c_str());
      for (size_t h = 0; h < d.heaps.size(); ++h)
        std::printf("  heap %zu: %s%s\n", h, format_bytes(d.heaps[h].size).c_str(),
                    d.heaps[h].device_local ? " device-local" : "");
      std::printf("  fp16 arithmetic: %s, fp16 storage: %s, subgroup size: %u, largest buffer: %s\n",
                  d.fp16_arithmetic ? "yes" : "no", d.fp16_storage ? "yes" : "no", d.subgroup_size,
                  format_bytes(d.largest_buffer).c_str());
    }
    std::printf("libraries:");
    for (auto& [name, version] : libraries.items())
      std::printf(" %s %s", name.c_str(), version.get<std::string>().c_str());
    std::printf("\n");
  });
}

}  // namespace tessera::cli
