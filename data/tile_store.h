// The LMDB tile store: named databases `tiles` (TileKey -> tile value, see tile_format.h) and
// `slides` (slide id as big-endian uint32 -> a JSON object: path, dimensions, level, tile size,
// microns per pixel, progress of the run that tiles it).
#pragma once
#include <lmdb.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/output.h"
#include "data/patches.h"
#include "data/tile_format.h"

namespace tessera::data {

class TileStoreWriter {
 public:
  // Opens or creates the store at `path` (a directory, or a single file if one exists there),
  // locked for this writer (common/output.h): a second writer fails at once, naming the store
  // and the run that holds it. Throws BadInput when the store's data file is truncated or not
  // LMDB's, and Error when one of its files is a link (LMDB would write through it).
  explicit TileStoreWriter(const std::string& path, uint64_t initial_map_size = uint64_t{1} << 30);
  ~TileStoreWriter();
  TileStoreWriter(const TileStoreWriter&) = delete;
  TileStoreWriter& operator=(const TileStoreWriter&) = delete;

  std::map<uint32_t, nlohmann::json> slides() const;

  struct Tile {
    TileKey key;
    std::vector<uint8_t> value;
  };
  // Puts `tiles` (keys ascending) and sets slide `slide`'s entry in one transaction, appending
  // (MDB_APPEND) when the keys lie past the end; the map grows when it is full. Throws a runtime
  // error naming the store when the disk refuses the write; what was committed before stays.
  void commit(uint32_t slide, const nlohmann::json& entry, const std::vector<Tile>& tiles);

  uint64_t map_size() const { return map_size_; }
  const std::string& path() const { return path_; }

 private:
  int try_commit(uint32_t slide, const std::string& entry, const std::vector<Tile>& tiles);

  std::string path_;
  OutputLock lock_;  // before env_, so it is released after the environment closes, and on a failed open
  MDB_env* env_ = nullptr;
  MDB_dbi tiles_ = 0, slides_ = 0;
  uint64_t map_size_ = 0;
};

// A tile store as labelled patches: slides in the order of their content fingerprint, each
// slide's tiles in key order; group(index) is the slide's rank in that order. Throws BadInput naming
// the store when it is missing, truncated or corrupt, not a tile store, or holds a slide that is
// not completely tiled.
std::unique_ptr<PatchSource> open_tile_store(const std::string& path);

// Several tile stores as one PatchSource (the shards of a cohort): slides ordered by content
// fingerprint, so one store and its shards yield the same patches in the same order; a slide's
// group is its rank there, so slides of different stores never share a group. Throws UsageError
// when one slide (by content) is in two stores.
std::unique_ptr<PatchSource> open_tile_stores(const std::vector<std::string>& paths);

// The stores that `given` names: a store itself, or a directory whose entries include stores
// (those entries, sorted by name). Throws BadInput for a directory without stores, UsageError
// naming `flag` when a store is named twice.
std::vector<std::string> find_tile_stores(const std::vector<std::string>& given, const std::string& flag);

// A tile store read slide by slide with a cursor, keeping no index of its tiles, so memory does
// not grow with the store (feature extraction over any number of slides).
class TileStoreReader {
 public:
  // Throws BadInput naming the store when it is missing or not a tile store.
  explicit TileStoreReader(const std::string& path);
  ~TileStoreReader();
  TileStoreReader(const TileStoreReader&) = delete;
  TileStoreReader& operator=(const TileStoreReader&) = delete;

  std::map<uint32_t, nlohmann::json> slides() const;
  // Calls visit(key, value) for the tiles of `slide` in key order, skipping its first `skip`;
  // the value's pixels are valid during the call only. Throws BadInput naming the store and the
  // tile when a value is corrupt.
  void for_each_tile(uint32_t slide, uint64_t skip,
                     const std::function<void(const TileKey&, const TileValue&)>& visit) const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  MDB_env* env_ = nullptr;
  MDB_dbi tiles_ = 0, slides_ = 0;
};

// `path` absolute and normalised, symbolic links left as they are: how the store records a
// slide's path, and how paths are compared (a slide or store named twice).
std::string canonical_path(const std::string& path);

// Whether a slide entry's tiles are RGB: its "rgb" (false for a multiplex slide's planes), else,
// in stores tiled before that was recorded, whether it has 3 channels.
inline bool slide_entry_rgb(const nlohmann::json& entry) {
  return entry.value("rgb", entry.value("channels", 3) == 3);
}

// True when `path` looks like an LMDB environment (a directory holding data.mdb, or a name
// ending in .lmdb).
bool is_tile_store_path(const std::string& path);

}  // namespace tessera::data
