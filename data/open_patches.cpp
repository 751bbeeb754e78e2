#include <array>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "data/patches.h"
#include "data/pcam_file.h"
#include "data/tile_store.h"

namespace tessera::data {

namespace {

bool has_hdf5_signature(const std::string& path) {
  static constexpr std::array<char, 8> signature{'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::array<char, 8> head{};
  std::ifstream file(path, std::ios::binary);
  return file.read(head.data(), head.size()) && head == signature;
}

}  // namespace

std::unique_ptr<PatchSource> open_patches(const std::string& path) {
  if (is_tile_store_path(path)) return open_tile_store(path);
  if (!std::filesystem::exists(path)) throw BadInput(path + ": no such file or directory");
  if (has_hdf5_signature(path)) return open_pcam_file(path);
  throw BadInput(path + ": neither an LMDB tile store (a directory with data.mdb, or *.lmdb) nor an HDF5 file");
}

std::unique_ptr<PatchSource> open_patches(const std::vector<std::string>& paths) {
  if (paths.size() == 1 && (is_tile_store_path(paths[0]) || !std::filesystem::is_directory(paths[0])))
    return open_patches(paths[0]);
  auto stores = find_tile_stores(paths, "--data");
  for (const std::string& store : stores)
    if (!is_tile_store_path(store))
      throw BadInput(store + ": not an LMDB tile store (several --data are tile stores, or a directory of them)");
  return open_tile_stores(stores);
}

}  // namespace tessera::data
