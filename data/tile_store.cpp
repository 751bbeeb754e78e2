#include "data/tile_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>

#include "common/error.h"
#include "common/json_input.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

std::string lmdb_message(int rc) {
  std::string text = mdb_strerror(rc);
  if (rc == ENOSPC || rc == EFBIG || rc == EDQUOT || rc == EIO)
    text +=
        " (the disk is full or a file size limit was reached; the tiles committed before are kept, "
        "free some space and run the same command again to resume)";
  return text;
}

[[noreturn]] void fail(const std::string& store, const std::string& what, int rc) {
  throw Error(ExitCode::runtime_error, store + ": " + what + ": " + lmdb_message(rc));
}

std::array<uint8_t, 4> slide_key(uint32_t slide) {
  return {static_cast<uint8_t>(slide >> 24), static_cast<uint8_t>(slide >> 16), static_cast<uint8_t>(slide >> 8),
          static_cast<uint8_t>(slide)};
}

MDB_val as_val(const void* data, size_t size) { return {size, const_cast<void*>(data)}; }

unsigned env_flags_for(const std::string& path) { return fs::is_regular_file(path) ? MDB_NOSUBDIR : 0u; }

// A read that fails is corrupt or unreadable input (exit 5), named by the store.
[[noreturn]] void fail_reading(const std::string& store, const std::string& what, int rc) {
  throw BadInput(store + ": " + what + ": " + mdb_strerror(rc));
}

// The end of a cursor walk is MDB_NOTFOUND; any other non-zero code is an error.
bool cursor_has_item(int rc, const std::string& store, const std::string& what) {
  if (rc == MDB_NOTFOUND) return false;
  if (rc) fail_reading(store, what, rc);
  return true;
}

uint64_t little_endian(const uint8_t* bytes, int size) {
  uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i) value = value << 8 | bytes[i];
  return value;
}

// LMDB maps the data file and faults (SIGBUS) on a page past its end, so the file is checked
// against its meta pages first: the newer of the two names the last page in use.
void check_data_file(const std::string& store, unsigned flags) {
  std::string file = (flags & MDB_NOSUBDIR) ? store : (fs::path(store) / "data.mdb").string();
  std::error_code error;
  uint64_t size = fs::file_size(file, error);
  if (error) return;  // a new store
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw BadInput(file + ": cannot open: " + std::strerror(errno));
  // Meta page: 16-byte page header, then magic u32, version u32, address, map size, two 48-byte
  // database records (the first one's first u32 is the page size), last page, transaction id.
  constexpr size_t meta_offset = 16, magic_at = 0, page_size_at = 24, last_page_at = 120, txn_at = 128;
  constexpr uint32_t magic = 0xBEEFC0DE;
  std::array<uint8_t, meta_offset + 136> meta{};
  auto read_meta = [&](uint64_t offset) {
    return ::pread(fd, meta.data(), meta.size(), static_cast<off_t>(offset)) == static_cast<ssize_t>(meta.size()) &&
           little_endian(&meta[meta_offset + magic_at], 4) == magic;
  };
  bool first = read_meta(0);
  uint64_t page_size = first ? little_endian(&meta[meta_offset + page_size_at], 4) : 0;
  uint64_t last_page = first ? little_endian(&meta[meta_offset + last_page_at], 8) : 0;
  uint64_t txn = first ? little_endian(&meta[meta_offset + txn_at], 8) : 0;
  bool second = page_size >= 512 && read_meta(page_size);
  if (second && little_endian(&meta[meta_offset + txn_at], 8) > txn)
    last_page = little_endian(&meta[meta_offset + last_page_at], 8);
  ::close(fd);
  if (!first || !second)
    throw BadInput(file + ": not an LMDB data file, or cut short (" + std::to_string(size) + " bytes, no valid meta pages)");
  uint64_t needed = (last_page + 1) * page_size;
  if (size < needed)
    throw BadInput(file + ": truncated: " + std::to_string(size) + " bytes, its meta page says " +
                   std::to_string(needed) + " are in use");
}

struct Transaction {
  MDB_txn* txn = nullptr;
  ~Transaction() {
    if (txn) mdb_txn_abort(txn);
  }
  int commit() {
    int rc = mdb_txn_commit(txn);
    txn = nullptr;
    return rc;
  }
};

// Opens a store read-only with its two databases. The database handles are opened in a
// transaction that commits, since handles survive only a committed transaction.
void open_read_only(const std::string& path, MDB_env*& env, MDB_dbi& tiles, MDB_dbi& slides) {
  if (!fs::exists(path)) throw BadInput(path + ": no such tile store");
  check_data_file(path, env_flags_for(path));
  if (int rc = mdb_env_create(&env)) fail(path, "creating the environment", rc);
  auto close = [&] {
    mdb_env_close(env);
    env = nullptr;
  };
  mdb_env_set_maxdbs(env, 2);
  if (int rc = mdb_env_open(env, path.c_str(), env_flags_for(path) | MDB_RDONLY | MDB_NOTLS, 0664)) {
    close();
    throw BadInput(path + ": not a readable LMDB tile store: " + mdb_strerror(rc));
  }
  Transaction txn;
  int rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn.txn);
  if (rc == 0 && (mdb_dbi_open(txn.txn, "tiles", 0, &tiles) || mdb_dbi_open(txn.txn, "slides", 0, &slides))) {
    mdb_txn_abort(std::exchange(txn.txn, nullptr));
    close();
    throw BadInput(path + ": no `tiles` and `slides` databases (not a tessera tile store)");
  }
  if (rc == 0) rc = txn.commit();
  if (rc) {
    close();
    fail_reading(path, "reading", rc);
  }
}

struct Cursor {
  MDB_cursor* cursor = nullptr;
  ~Cursor() {
    if (cursor) mdb_cursor_close(cursor);
  }
};

std::map<uint32_t, SlideRecord> read_slides(MDB_txn* txn, MDB_dbi slides, const std::string& store) {
  std::map<uint32_t, SlideRecord> records;
  Cursor cursor;
  if (int rc = mdb_cursor_open(txn, slides, &cursor.cursor)) fail_reading(store, "reading slides", rc);
  MDB_val key, value;
  for (int rc = mdb_cursor_get(cursor.cursor, &key, &value, MDB_FIRST); cursor_has_item(rc, store, "reading slides");
       rc = mdb_cursor_get(cursor.cursor, &key, &value, MDB_NEXT)) {
    if (key.mv_size != 4) throw BadInput(store + ": a slide key has " + std::to_string(key.mv_size) + " bytes");
    auto* k = static_cast<const uint8_t*>(key.mv_data);
    uint32_t id = uint32_t{k[0]} << 24 | uint32_t{k[1]} << 16 | uint32_t{k[2]} << 8 | k[3];
    auto text = std::string_view(static_cast<const char*>(value.mv_data), value.mv_size);
    std::string where = store + ": slide " + std::to_string(id);
    records.emplace(id, SlideRecord::from_json(parse_json_input(text, where + ": slide entry"), where));
  }
  return records;
}

}  // namespace

bool is_tile_store_path(const std::string& path) {
  if (fs::is_directory(path)) return fs::exists(fs::path(path) / "data.mdb");
  return fs::path(path).extension() == ".lmdb";
}

namespace {

// The store's parent directory exists, so that its lock can be made beside it.
const std::string& with_parent_directory(const std::string& path) {
  std::error_code error;
  fs::path parent = fs::absolute(path).parent_path();
  fs::create_directories(parent, error);
  if (error)
    throw Error(ExitCode::runtime_error,
                path + ": cannot create the directory " + parent.string() + ": " + error.message());
  return path;
}

}  // namespace

TileStoreWriter::TileStoreWriter(const std::string& path, uint64_t initial_map_size)
    : path_(path), lock_(with_parent_directory(path)), created_(!output_exists(path)) {
  // One writer per store: LMDB serialises transactions, not runs, and two runs would both take
  // the next slide id. The lock is taken before anything in the store is read or written.
  try {
    open(initial_map_size);
  } catch (...) {
    discard();  // a store this writer began and could not open (a full disk) is not left half made
    throw;
  }
}

void TileStoreWriter::open(uint64_t initial_map_size) {
  const std::string& path = path_;
  unsigned flags = env_flags_for(path);
  if (!(flags & MDB_NOSUBDIR)) {
    std::error_code error;
    fs::create_directories(path, error);
    if (error) throw Error(ExitCode::runtime_error, path + ": cannot create the tile store: " + error.message());
  }
  // LMDB opens its files by name and would write through a link planted at one.
  for (const std::string& file : (flags & MDB_NOSUBDIR) ? std::vector<std::string>{path, path + "-lock"}
                                                        : std::vector<std::string>{(fs::path(path) / "data.mdb").string(),
                                                                                   (fs::path(path) / "lock.mdb").string()})
    if (fs::is_symlink(file))
      throw Error(ExitCode::runtime_error, file + ": a link inside the tile store; tessera never writes through links");
  check_data_file(path, flags);
  if (int rc = mdb_env_create(&env_)) fail(path, "creating the environment", rc);
  mdb_env_set_maxdbs(env_, 2);
  mdb_env_set_mapsize(env_, initial_map_size);
  if (int rc = mdb_env_open(env_, path.c_str(), flags, 0664)) {
    mdb_env_close(env_);
    env_ = nullptr;
    fail(path, "opening the tile store", rc);
  }
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
  Transaction txn;
  int rc = mdb_txn_begin(env_, nullptr, 0, &txn.txn);
  if (!rc) rc = mdb_dbi_open(txn.txn, "tiles", MDB_CREATE, &tiles_);
  if (!rc) rc = mdb_dbi_open(txn.txn, "slides", MDB_CREATE, &slides_);
  if (!rc) rc = txn.commit();
  if (rc) {
    mdb_env_close(env_);
    env_ = nullptr;
    fail(path, "creating the databases", rc);
  }
}

TileStoreWriter::~TileStoreWriter() {
  if (env_) mdb_env_close(env_);
}

void TileStoreWriter::discard() noexcept {
  if (!created_) return;
  if (env_) mdb_env_close(std::exchange(env_, nullptr));
  std::error_code ignored;
  for (const char* file : {"data.mdb", "lock.mdb"}) fs::remove(fs::path(path_) / file, ignored);
  fs::remove(path_, ignored);  // the directory, unless something else was put there meanwhile
}

std::map<uint32_t, SlideRecord> TileStoreWriter::slides() const {
  Transaction txn;
  if (int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn.txn)) fail(path_, "reading slides", rc);
  return read_slides(txn.txn, slides_, path_);
}

int TileStoreWriter::try_commit(uint32_t slide, const std::string& entry, const std::vector<Tile>& tiles) {
  Transaction txn;
  if (int rc = mdb_txn_begin(env_, nullptr, 0, &txn.txn)) return rc;
  unsigned put_flags = 0;
  if (!tiles.empty()) {
    Cursor cursor;
    if (int rc = mdb_cursor_open(txn.txn, tiles_, &cursor.cursor)) return rc;
    MDB_val last_key, last_value;
    int rc = mdb_cursor_get(cursor.cursor, &last_key, &last_value, MDB_LAST);
    if (rc == MDB_NOTFOUND || (rc == 0 && decode_tile_key(last_key.mv_data, last_key.mv_size) < tiles.front().key))
      put_flags = MDB_APPEND;
    else if (rc)
      return rc;
  }
  for (const Tile& tile : tiles) {
    auto key_bytes = encode_tile_key(tile.key);
    MDB_val key = as_val(key_bytes.data(), key_bytes.size());
    MDB_val value = as_val(tile.value.data(), tile.value.size());
    if (int rc = mdb_put(txn.txn, tiles_, &key, &value, put_flags)) return rc;
  }
  auto id = slide_key(slide);
  MDB_val key = as_val(id.data(), id.size());
  MDB_val value = as_val(entry.data(), entry.size());
  if (int rc = mdb_put(txn.txn, slides_, &key, &value, 0)) return rc;
  return txn.commit();
}

void TileStoreWriter::commit(uint32_t slide, const SlideRecord& record, const std::vector<Tile>& tiles) {
  std::string text = record.to_json().dump();
  for (;;) {
    int rc = try_commit(slide, text, tiles);
    if (rc == 0) {
      tiles_committed_ += tiles.size();
      return;
    }
    if (rc != MDB_MAP_FULL) fail(path_, "writing " + std::to_string(tiles.size()) + " tiles", rc);
    // Double the map: grows a store of any size in few steps; LMDB only reserves address space.
    if (int grow = mdb_env_set_mapsize(env_, map_size_ * 2)) fail(path_, "growing the map", grow);
    MDB_envinfo info;
    mdb_env_info(env_, &info);
    map_size_ = info.me_mapsize;
  }
}

namespace {

// A completely tiled slide of a store: its keys, and each tile checked against its record.
class StoreTiles final : public TileSource {
 public:
  StoreTiles(const std::string& store, MDB_env* env, MDB_dbi tiles, uint32_t id, SlideRecord record)
      : store_(store), env_(env), tiles_(tiles), id_(id), record_(std::move(record)) {
    std::string slide = store + ": slide " + std::to_string(id) + " (" + record_.path + ")";
    if (!record_.complete)
      throw BadInput(slide + " is not completely tiled: run the same tessera tile command again to finish it");
    Transaction txn;
    if (int rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn.txn)) fail_reading(store, "reading tiles", rc);
    Cursor cursor;
    if (int rc = mdb_cursor_open(txn.txn, tiles, &cursor.cursor)) fail_reading(store, "reading tiles", rc);
    auto first = encode_tile_key({id, 0, 0, 0});
    MDB_val key = as_val(first.data(), first.size()), value;
    for (int rc = mdb_cursor_get(cursor.cursor, &key, &value, MDB_SET_RANGE); cursor_has_item(rc, store, "reading tiles");
         rc = mdb_cursor_get(cursor.cursor, &key, &value, MDB_NEXT)) {
      TileKey tile = decode_tile_key(key.mv_data, key.mv_size);
      if (tile.slide != id) break;
      keys_.push_back(tile);
    }
    // A zeroed or stale page can read as a short database that LMDB ends with MDB_NOTFOUND.
    if (keys_.size() != record_.tiles)
      throw BadInput(slide + " lists " + std::to_string(record_.tiles) + " tiles, the store yields " +
                     std::to_string(keys_.size()) + " (a corrupt store)");
  }

  const SlideRecord& record() const override { return record_; }
  size_t size() const override { return keys_.size(); }
  TileOrigin origin(size_t index) const override {
    const TileKey& key = keys_.at(index);
    return {record_.tile_x(key.column), record_.tile_y(key.row)};
  }
  std::string describe(size_t index) const override { return store_ + " tile " + data::describe(keys_.at(index)); }

  uint32_t read(size_t index, uint8_t* pixels) const override {
    const TileKey& tile = keys_.at(index);
    std::string where = describe(index);
    Transaction txn;
    if (int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn.txn)) fail(store_, "reading " + data::describe(tile), rc);
    auto key_bytes = encode_tile_key(tile);
    MDB_val key = as_val(key_bytes.data(), key_bytes.size()), value;
    if (int rc = mdb_get(txn.txn, tiles_, &key, &value)) throw BadInput(where + ": " + mdb_strerror(rc));
    TileValue tile_value = parse_tile_value(value.mv_data, value.mv_size, where);
    const TileHeader& header = tile_value.header;
    if (header.width != record_.tile_size || header.height != record_.tile_size)
      throw BadInput(where + ": tile is " + std::to_string(header.width) + "x" + std::to_string(header.height) +
                     ", its slide's tile size is " + std::to_string(record_.tile_size));
    if (header.channels != record_.channels)
      throw BadInput(where + ": tile has " + std::to_string(header.channels) + " channels, its slide " +
                     std::to_string(record_.channels));
    if (TileOrigin at = origin(index); at.x != header.x || at.y != header.y)
      throw BadInput(where + ": tile says it lies at (" + std::to_string(header.x) + ", " + std::to_string(header.y) +
                     "), its place in the grid is (" + std::to_string(at.x) + ", " + std::to_string(at.y) + ")");
    // A label its slide's record does not count would reach the loss as an out-of-range class.
    const std::vector<uint64_t>& counts = record_.label_counts;
    if (header.label >= counts.size() || counts[header.label] == 0)
      throw BadInput(where + ": label " + std::to_string(header.label) +
                     ", a class its slide's label_counts do not list (" + std::to_string(counts.size()) +
                     " classes counted): a corrupt or edited store");
    if (pixels) decode_tile_pixels(tile_value, pixels, where);
    return header.label;
  }

 private:
  std::string store_;
  MDB_env* env_;
  MDB_dbi tiles_;
  uint32_t id_;
  SlideRecord record_;
  std::vector<TileKey> keys_;
};

// One or more stores as one list of patches: slides ordered by content (their fingerprint), each
// slide's tiles in key order, so the same slides read the same whether tiled into one store or
// several (shards), in whatever order they were given to `tile`. A slide's group is its rank.
class TileStores final : public PatchSource {
 public:
  explicit TileStores(const std::vector<std::string>& paths) {
    struct Slide {
      std::string fingerprint;
      uint32_t store, id;
      SlideRecord record;
    };
    std::vector<Slide> slides;
    for (uint32_t index = 0; index < paths.size(); ++index) {
      const TileStore& store = *stores_.emplace_back(std::make_unique<TileStore>(paths[index]));
      for (auto& [id, record] : store.slides()) slides.push_back({record.fingerprint, index, id, std::move(record)});
    }
    // Records written before fingerprints existed sort first, by store and id.
    std::sort(slides.begin(), slides.end(), [](const Slide& a, const Slide& b) {
      return std::tie(a.fingerprint, a.store, a.id) < std::tie(b.fingerprint, b.store, b.id);
    });
    for (size_t rank = 0; rank < slides.size(); ++rank) {
      const Slide& slide = slides[rank];
      const std::string& path = paths[slide.store];
      if (rank > 0 && !slide.fingerprint.empty() && slide.fingerprint == slides[rank - 1].fingerprint) {
        const Slide& other = slides[rank - 1];
        throw UsageError("--data: slide " + std::to_string(other.id) + " of " + paths[other.store] + " and slide " +
                         std::to_string(slide.id) + " of " + path + " are the same slide (" + slide.fingerprint +
                         "): its tiles would count twice");
      }
      const SlideRecord& record = slide.record;
      if (rank > 0 && record.tile_size != tile_size_)
        throw BadInput(path + ": slides with tile sizes " + std::to_string(tile_size_) + " and " +
                       std::to_string(record.tile_size) + " in " + describe_paths());
      if (rank > 0 && (record.channels != channels_ || record.rgb != rgb_))
        throw BadInput(path + ": slide " + std::to_string(slide.id) + " has " +
                       channels_in_words(record.channels, record.rgb) + ", other slides " +
                       channels_in_words(channels_, rgb_) + " in " + describe_paths());
      tile_size_ = record.tile_size;
      channels_ = record.channels;
      rgb_ = record.rgb;
      class_count_ = std::max(class_count_, record.class_count());
      const TileSource& source = *slides_.emplace_back(stores_[slide.store]->tiles(slide.id, record));
      for (uint32_t tile = 0; tile < source.size(); ++tile) tiles_.push_back({static_cast<uint32_t>(rank), tile});
    }
  }

  size_t size() const override { return tiles_.size(); }
  int height() const override { return tile_size_; }
  int width() const override { return tile_size_; }
  int channels() const override { return channels_; }
  bool rgb() const override { return rgb_; }
  uint32_t class_count() const override { return class_count_; }
  uint64_t group(size_t index) const override { return tiles_.at(index).slide; }
  std::vector<uint64_t> class_counts(uint64_t group) const override { return slides_.at(group)->record().label_counts; }
  std::string group_name(uint64_t group) const override { return slides_.at(group)->record().path; }

  uint32_t read(size_t index, uint8_t* rgb) const override {
    const Tile& tile = tiles_.at(index);
    return slides_[tile.slide]->read(tile.index, rgb);
  }

  std::string description() const override {
    return describe_paths() + ": " + std::to_string(tiles_.size()) + " tiles of " + std::to_string(tile_size_) +
           "x" + std::to_string(tile_size_) + " from " + std::to_string(slides_.size()) + " slides, " +
           std::to_string(class_count_) + " classes";
  }

 private:
  std::string describe_paths() const {
    std::string text = stores_.size() == 1 ? "LMDB tile store" : "LMDB tile stores";
    for (size_t i = 0; i < stores_.size(); ++i) text += (i ? ", " : " ") + stores_[i]->path();
    return text;
  }

  struct Tile {
    uint32_t slide, index;  // the slide's rank, the tile's index in its source
  };

  std::vector<std::unique_ptr<TileStore>> stores_;
  std::vector<std::unique_ptr<TileSource>> slides_;  // by rank
  std::vector<Tile> tiles_;
  int tile_size_ = 0, channels_ = 3;
  bool rgb_ = true;
  uint32_t class_count_ = 1;
};

}  // namespace

TileStore::TileStore(const std::string& path) : path_(path) { open_read_only(path, env_, tiles_, slides_); }

TileStore::~TileStore() {
  if (env_) mdb_env_close(env_);
}

std::map<uint32_t, SlideRecord> TileStore::slides() const {
  Transaction txn;
  if (int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn.txn)) fail(path_, "reading slides", rc);
  return read_slides(txn.txn, slides_, path_);
}

std::unique_ptr<TileSource> TileStore::tiles(uint32_t id, const SlideRecord& record) const {
  return std::make_unique<StoreTiles>(path_, env_, tiles_, id, record);
}

std::string canonical_path(const std::string& path) {
  fs::path normal = fs::absolute(path).lexically_normal();
  // "store/" and "store/." name the directory "store" names.
  return (normal.has_filename() ? normal : normal.parent_path()).string();
}

std::unique_ptr<PatchSource> open_tile_store(const std::string& path) {
  return std::make_unique<TileStores>(std::vector<std::string>{path});
}

std::unique_ptr<PatchSource> open_tile_stores(const std::vector<std::string>& paths) {
  return std::make_unique<TileStores>(paths);
}

std::vector<std::string> find_tile_stores(const std::vector<std::string>& given, const std::string& flag) {
  std::vector<std::string> stores;
  for (const std::string& path : given) {
    if (is_tile_store_path(path) || !fs::is_directory(path)) {
      stores.push_back(path);
      continue;
    }
    std::vector<std::string> inside;  // a directory of stores: each store in it, by name
    for (const fs::directory_entry& entry : fs::directory_iterator(path))
      if (is_tile_store_path(entry.path().string())) inside.push_back(entry.path().string());
    if (inside.empty()) throw BadInput(path + ": neither a tile store nor a directory holding tile stores");
    std::sort(inside.begin(), inside.end());
    stores.insert(stores.end(), inside.begin(), inside.end());
  }
  std::map<std::string, std::string> seen;  // absolute path -> as given
  for (const std::string& store : stores)
    if (auto [at, fresh] = seen.emplace(canonical_path(store), store); !fresh)
      throw UsageError(flag + ": " + store + " is given twice (as " + at->second + ")");
  return stores;
}

}  // namespace tessera::data
