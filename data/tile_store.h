// The LMDB tile store: named databases `tiles` (TileKey -> tile value, see tile_format.h) and
// `slides` (slide id as big-endian uint32 -> its SlideRecord as JSON: slide_record.h). One writer
// (TileStoreWriter) and one reader (TileStore), whose slides are TileSources.
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
#include "data/slide_record.h"
#include "data/tile_format.h"
#include "data/tile_source.h"

namespace tessera::data {

class TileStoreWriter {
 public:
  // Opens or creates the store at `path` (a directory, or a single file if one exists there),
  // locked for this writer (common/output.h): a second writer fails at once, naming the store
  // and the run that holds it. Throws BadInput when the store's data file is truncated or not
  // LMDB's, and Error when one of its files is a link (LMDB would write through it); a store it
  // was creating is removed then.
  explicit TileStoreWriter(const std::string& path, uint64_t initial_map_size = uint64_t{1} << 30);
  ~TileStoreWriter();
  TileStoreWriter(const TileStoreWriter&) = delete;
  TileStoreWriter& operator=(const TileStoreWriter&) = delete;

  // Every slide's record; throws BadInput naming the store and slide when one is malformed.
  std::map<uint32_t, SlideRecord> slides() const;

  struct Tile {
    TileKey key;
    std::vector<uint8_t> value;
  };
  // Puts `tiles` (keys ascending) and sets slide `slide`'s record in one transaction, appending
  // (MDB_APPEND) when the keys lie past the end; the map grows when it is full. Throws a runtime
  // error naming the store when the disk refuses the write; what was committed before stays.
  void commit(uint32_t slide, const SlideRecord& record, const std::vector<Tile>& tiles);

  uint64_t map_size() const { return map_size_; }
  const std::string& path() const { return path_; }
  // Whether nothing was at `path` before this writer: the store is this run's.
  bool created() const { return created_; }
  // Tiles this writer has committed.
  uint64_t tiles_committed() const { return tiles_committed_; }
  // Closes the store and removes it when this writer created it (nothing otherwise), so that a
  // run that fails leaves nothing behind; the writer is of no further use.
  void discard() noexcept;

 private:
  void open(uint64_t initial_map_size);
  int try_commit(uint32_t slide, const std::string& entry, const std::vector<Tile>& tiles);

  std::string path_;
  OutputLock lock_;  // before env_, so it is released after the environment closes, and on a failed open
  bool created_ = false;
  uint64_t tiles_committed_ = 0;
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

// A tile store, read-only (readers take no lock: LMDB's MVCC).
class TileStore {
 public:
  // Throws BadInput naming the store when it is missing, truncated or not a tile store.
  explicit TileStore(const std::string& path);
  ~TileStore();
  TileStore(const TileStore&) = delete;
  TileStore& operator=(const TileStore&) = delete;

  // Every slide's record; throws BadInput naming the store and slide when one is malformed.
  std::map<uint32_t, SlideRecord> slides() const;
  // The tiles of slide `id` (its record given) in key order, their keys read in one cursor walk
  // (16 bytes a tile). Throws BadInput naming the store and slide when it is not completely
  // tiled, or when the walk finds other than the tiles its record lists (a corrupt store). Each
  // read checks the tile's checksum, size, channels, origin and label against the record.
  std::unique_ptr<TileSource> tiles(uint32_t id, const SlideRecord& record) const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  MDB_env* env_ = nullptr;
  MDB_dbi tiles_ = 0, slides_ = 0;
};

// `path` absolute and normalised, symbolic links left as they are: how the store records a
// slide's path, and how paths are compared (a slide or store named twice).
std::string canonical_path(const std::string& path);

// True when `path` looks like an LMDB environment (a directory holding data.mdb, or a name
// ending in .lmdb).
bool is_tile_store_path(const std::string& path);

}  // namespace tessera::data
