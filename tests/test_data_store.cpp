// The LMDB tile store: key order, checksummed values, map growth, the PatchSource view; and its
// slide entries as SlideRecord reads and writes them (defaults of old stores, malformed entries).
#include <gtest/gtest.h>
#include <lmdb.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>

#include "common/error.h"
#include "data/jpeg.h"
#include "data/patches.h"
#include "data/slide_record.h"
#include "data/tile_format.h"
#include "data/tile_store.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::data;

namespace {

fs::path fresh_directory(const std::string& name) {
  fs::path path = fs::temp_directory_path() / ("tessera_test_data_store_" + name);
  fs::remove_all(path);
  return path;
}

// A tile whose pixels depend on its key, so a mix-up shows.
std::vector<uint8_t> pattern(const TileKey& key, int size) {
  std::vector<uint8_t> rgb(static_cast<size_t>(size) * size * 3);
  for (size_t i = 0; i < rgb.size(); ++i)
    rgb[i] = static_cast<uint8_t>(i * 7 + key.row * 31 + key.column * 17 + key.slide * 5);
  return rgb;
}

TileStoreWriter::Tile raw_tile(const TileKey& key, int size, uint32_t label) {
  auto rgb = pattern(key, size);
  TileHeader header{static_cast<uint16_t>(size),
                    static_cast<uint16_t>(size),
                    3,
                    TileEncoding::raw,
                    label,
                    key.column * static_cast<uint32_t>(size),  // level 0, where the record's grid puts it
                    key.row * static_cast<uint32_t>(size)};
  return {key, encode_tile_value(header, rgb.data(), rgb.size())};
}

// A completely tiled slide of tile_size `size` whose tiles have these labels (label -> tiles).
SlideRecord entry(int size, const std::map<uint32_t, uint64_t>& label_counts) {
  SlideRecord record;
  record.tile_size = size;
  for (auto [label, tiles] : label_counts) {
    if (label >= record.label_counts.size()) record.label_counts.resize(label + size_t{1});
    record.label_counts[label] = tiles;
    record.tiles += tiles;
  }
  record.candidates = record.done = record.tiles;
  record.complete = true;
  return record;
}

// Changes a store behind its writer's back, as another program or bad media would: `edit` gets a
// write transaction and the store's `tiles` and `slides` databases.
void edit_store(const fs::path& store, const std::function<void(MDB_txn*, MDB_dbi, MDB_dbi)>& edit) {
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 2);
  ASSERT_EQ(mdb_env_open(env, store.c_str(), 0, 0664), 0);
  MDB_txn* txn = nullptr;
  MDB_dbi tiles = 0, slides = 0;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  ASSERT_EQ(mdb_dbi_open(txn, "tiles", 0, &tiles), 0);
  ASSERT_EQ(mdb_dbi_open(txn, "slides", 0, &slides), 0);
  edit(txn, tiles, slides);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

// Sets slide `id`'s entry to `entry` as written, whatever it holds.
void put_slide_entry(const fs::path& store, uint32_t id, const nlohmann::json& entry) {
  edit_store(store, [&](MDB_txn* txn, MDB_dbi, MDB_dbi slides) {
    std::array<uint8_t, 4> key_bytes{static_cast<uint8_t>(id >> 24), static_cast<uint8_t>(id >> 16),
                                     static_cast<uint8_t>(id >> 8), static_cast<uint8_t>(id)};
    std::string text = entry.dump();
    MDB_val key{key_bytes.size(), key_bytes.data()}, value{text.size(), text.data()};
    ASSERT_EQ(mdb_put(txn, slides, &key, &value, 0), 0);
  });
}

}  // namespace

TEST(TileStore, KeysSortBySlideLevelRowColumn) {
  std::vector<TileKey> keys{{0, 0, 0, 1}, {0, 0, 1, 0}, {0, 1, 0, 0}, {1, 0, 0, 0}, {0, 0, 0, 300}, {2, 0, 70000, 5}};
  std::sort(keys.begin(), keys.end());
  for (size_t i = 1; i < keys.size(); ++i) {
    auto a = encode_tile_key(keys[i - 1]), b = encode_tile_key(keys[i]);
    EXPECT_LT(std::memcmp(a.data(), b.data(), tile_key_size), 0) << describe(keys[i]);
  }
  auto bytes = encode_tile_key({3, 1, 258, 65539});
  EXPECT_EQ(bytes[3], 3);
  EXPECT_EQ(bytes[10], 1);
  EXPECT_EQ(bytes[11], 2);
  EXPECT_EQ(decode_tile_key(bytes.data(), bytes.size()), (TileKey{3, 1, 258, 65539}));
  EXPECT_EQ(describe({3, 1, 258, 65539}), "slide 3 level 1 row 258 column 65539");
}

TEST(TileStore, ValueHeaderRoundTripsAndChecksumCatchesOneFlippedBit) {
  auto tile = raw_tile({1, 0, 2, 3}, 16, 7);
  ASSERT_EQ(tile.value.size(), tile_header_size + 16 * 16 * 3);
  auto value = parse_tile_value(tile.value.data(), tile.value.size(), "here");
  EXPECT_EQ(value.header.width, 16);
  EXPECT_EQ(value.header.height, 16);
  EXPECT_EQ(value.header.label, 7u);
  EXPECT_EQ(value.header.x, 48u);  // column 3 of 16-pixel tiles
  EXPECT_EQ(value.header.y, 32u);
  EXPECT_EQ(value.header.encoding, TileEncoding::raw);
  tile.value[tile_header_size + 100] ^= 0x10;
  try {
    parse_tile_value(tile.value.data(), tile.value.size(), "store tile slide 1 level 0 row 2 column 3");
    FAIL() << "a flipped bit went unnoticed";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("slide 1 level 0 row 2 column 3: checksum mismatch"), std::string::npos)
        << e.what();
  }
}

TEST(TileStore, ReaderSeesTilesLabelsAndSlidesAsGroups) {
  auto path = fresh_directory("reader");
  {
    TileStoreWriter writer(path.string());
    std::vector<TileStoreWriter::Tile> slide0{raw_tile({0, 0, 0, 0}, 32, 0), raw_tile({0, 0, 0, 1}, 32, 1),
                                              raw_tile({0, 0, 1, 0}, 32, 1)};
    writer.commit(0, entry(32, {{0, 1}, {1, 2}}), slide0);
    writer.commit(1, entry(32, {{0, 1}, {2, 1}}), {raw_tile({1, 0, 5, 5}, 32, 2), raw_tile({1, 0, 5, 6}, 32, 0)});
    EXPECT_EQ(writer.slides().size(), 2u);
  }
  auto store = open_tile_store(path.string());
  ASSERT_EQ(store->size(), 5u);
  EXPECT_EQ(store->width(), 32);
  EXPECT_EQ(store->height(), 32);
  EXPECT_EQ(store->class_count(), 3u);
  std::vector<uint64_t> groups;
  for (size_t i = 0; i < store->size(); ++i) groups.push_back(store->group(i));
  EXPECT_EQ(groups, (std::vector<uint64_t>{0, 0, 0, 1, 1}));
  std::vector<uint8_t> rgb(32 * 32 * 3);
  EXPECT_EQ(store->read(3, rgb.data()), 2u);
  EXPECT_EQ(rgb, pattern({1, 0, 5, 5}, 32));
  EXPECT_EQ(store->read(1, rgb.data()), 1u);
  EXPECT_EQ(rgb, pattern({0, 0, 0, 1}, 32));
  EXPECT_NE(store->description().find("5 tiles"), std::string::npos);
}

TEST(TileStore, OpenPatchesOpensAStoreDirectoryAndRejectsOtherThings) {
  auto path = fresh_directory("dispatch");
  TileStoreWriter(path.string()).commit(0, entry(8, {{0, 1}}), {raw_tile({0, 0, 0, 0}, 8, 0)});
  EXPECT_TRUE(is_tile_store_path(path.string()));
  EXPECT_EQ(open_tile_store(path.string())->size(), 1u);
  EXPECT_EQ(open_patches(path.string())->size(), 1u);
  EXPECT_EQ(open_patches(path.string())->group(0), 0u);
  EXPECT_THROW(open_tile_store((path / "missing.lmdb").string()), BadInput);
  EXPECT_THROW(open_patches((path / "missing.lmdb").string()), BadInput);
  EXPECT_THROW(open_patches((path / "data.mdb.txt").string()), BadInput);
}

TEST(TileStore, SeveralStoresReadAsOneOrderedByContent) {
  // Two shards, each with its own slide 0: the slides are ordered by fingerprint, not by store or
  // id, and each is its own group.
  auto first = fresh_directory("shard_a"), second = fresh_directory("shard_b");
  auto with_fingerprint = [](std::string fingerprint, uint64_t tiles) {
    SlideRecord described = entry(8, {{0, tiles}});
    described.fingerprint = std::move(fingerprint);
    return described;
  };
  TileStoreWriter(first.string()).commit(0, with_fingerprint("c", 1), {raw_tile({0, 0, 0, 0}, 8, 0)});
  {
    TileStoreWriter writer(second.string());
    writer.commit(0, with_fingerprint("b", 2), {raw_tile({0, 0, 1, 0}, 8, 0), raw_tile({0, 0, 1, 1}, 8, 0)});
    writer.commit(1, with_fingerprint("a", 1), {raw_tile({1, 0, 2, 0}, 8, 0)});
  }
  auto stores = open_tile_stores({first.string(), second.string()});
  ASSERT_EQ(stores->size(), 4u);
  std::vector<uint64_t> groups;
  for (size_t i = 0; i < stores->size(); ++i) groups.push_back(stores->group(i));
  EXPECT_EQ(groups, (std::vector<uint64_t>{0, 1, 1, 2}));
  std::vector<uint8_t> rgb(8 * 8 * 3);
  const std::vector<TileKey> expected{{1, 0, 2, 0}, {0, 0, 1, 0}, {0, 0, 1, 1}, {0, 0, 0, 0}};
  for (size_t i = 0; i < expected.size(); ++i) {
    stores->read(i, rgb.data());
    EXPECT_EQ(rgb, pattern(expected[i], 8)) << i;
  }
  EXPECT_NE(stores->description().find("from 3 slides"), std::string::npos) << stores->description();
  // The same slide in two stores would count twice.
  auto copy = fresh_directory("shard_copy");
  TileStoreWriter(copy.string()).commit(5, with_fingerprint("a", 1), {raw_tile({5, 0, 0, 0}, 8, 0)});
  EXPECT_THROW(open_tile_stores({second.string(), copy.string()}), UsageError);
  EXPECT_THROW(find_tile_stores({first.string(), (first / ".").string()}, "--data"), UsageError);
}

TEST(TileStore, MapGrowsWhenFull) {
  auto path = fresh_directory("growth");
  TileStoreWriter writer(path.string(), uint64_t{1} << 20);
  uint64_t initial = writer.map_size();
  std::vector<TileStoreWriter::Tile> tiles;
  for (uint32_t column = 0; column < 40; ++column) tiles.push_back(raw_tile({0, 0, 0, column}, 256, column % 2));
  writer.commit(0, entry(256, {{0, 20}, {1, 20}}), tiles);  // about 7.5 MiB into a 1 MiB map
  EXPECT_GE(writer.map_size(), 8 * initial);
  auto store = open_tile_store(path.string());
  ASSERT_EQ(store->size(), 40u);
  std::vector<uint8_t> rgb(256 * 256 * 3);
  EXPECT_EQ(store->read(39, rgb.data()), 1u);
  EXPECT_EQ(rgb, pattern({0, 0, 0, 39}, 256));
}

TEST(TileStore, AppendsOutOfOrderSlidesWithoutLosingTiles) {
  auto path = fresh_directory("order");
  TileStoreWriter writer(path.string());
  writer.commit(1, entry(8, {{0, 1}}), {raw_tile({1, 0, 0, 0}, 8, 0)});
  writer.commit(0, entry(8, {{0, 2}}), {raw_tile({0, 0, 0, 0}, 8, 0), raw_tile({0, 0, 3, 3}, 8, 0)});
  auto store = open_tile_store(path.string());
  ASSERT_EQ(store->size(), 3u);
  EXPECT_EQ(store->group(0), 0u);
  EXPECT_EQ(store->group(2), 1u);
}

TEST(TileStore, CorruptValueNamesItsKey) {
  auto path = fresh_directory("corrupt");
  TileStoreWriter(path.string())
      .commit(0, entry(16, {{0, 3}}),
              {raw_tile({0, 0, 0, 0}, 16, 0), raw_tile({0, 0, 1, 2}, 16, 0), raw_tile({0, 0, 4, 4}, 16, 0)});
  // Flip one pixel byte of the middle tile behind the store's back, as bad media would.
  edit_store(path, [](MDB_txn* txn, MDB_dbi tiles, MDB_dbi) {
    auto key_bytes = encode_tile_key({0, 0, 1, 2});
    MDB_val key{key_bytes.size(), key_bytes.data()}, value;
    ASSERT_EQ(mdb_get(txn, tiles, &key, &value), 0);
    std::vector<uint8_t> bytes(static_cast<uint8_t*>(value.mv_data),
                               static_cast<uint8_t*>(value.mv_data) + value.mv_size);
    bytes[tile_header_size + 5] ^= 0xff;
    MDB_val corrupted{bytes.size(), bytes.data()};
    ASSERT_EQ(mdb_put(txn, tiles, &key, &corrupted, 0), 0);
  });

  auto store = open_tile_store(path.string());
  std::vector<uint8_t> rgb(16 * 16 * 3);
  EXPECT_EQ(store->read(0, rgb.data()), 0u);
  try {
    store->read(1, rgb.data());
    FAIL() << "the corrupt value was read";
  } catch (const BadInput& e) {
    std::string message = e.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find("slide 0 level 0 row 1 column 2: checksum mismatch"), std::string::npos) << message;
  }
  EXPECT_EQ(store->read(2, rgb.data()), 0u);
}

TEST(TileStore, JpegValuesDecodeCloseToTheirPixels) {
  std::vector<uint8_t> rgb(64 * 64 * 3);
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 64; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * 64 + x) * 3];
      p[0] = static_cast<uint8_t>(180 + x / 2);
      p[1] = static_cast<uint8_t>(100 + y);
      p[2] = 170;
    }
  auto jpeg = encode_jpeg(rgb.data(), 64, 64, 90);
  EXPECT_LT(jpeg.size(), rgb.size() / 4);
  auto value = encode_tile_value({64, 64, 3, TileEncoding::jpeg, 1, 0, 0}, jpeg.data(), jpeg.size());
  std::vector<uint8_t> decoded(rgb.size());
  decode_tile_pixels(parse_tile_value(value.data(), value.size(), "jpeg"), decoded.data(), "jpeg");
  double error = 0;
  for (size_t i = 0; i < rgb.size(); ++i) error += std::abs(int(rgb[i]) - int(decoded[i]));
  EXPECT_LT(error / static_cast<double>(rgb.size()), 2.0);
  EXPECT_FALSE(decode_jpeg(jpeg.data(), jpeg.size() / 2, 64, 64, decoded.data()).empty());
  EXPECT_FALSE(check_jpeg(jpeg.data(), jpeg.size(), 32, 64).empty());
}

namespace {

// Every field of `read` equals `written`'s.
void expect_same_record(const SlideRecord& read, const SlideRecord& written) {
  EXPECT_EQ(read.path, written.path);
  EXPECT_EQ(read.name, written.name);
  EXPECT_EQ(read.format, written.format);
  EXPECT_EQ(read.fingerprint, written.fingerprint);
  EXPECT_EQ(read.width, written.width);
  EXPECT_EQ(read.height, written.height);
  EXPECT_EQ(read.mpp_x, written.mpp_x);
  EXPECT_EQ(read.mpp_y, written.mpp_y);
  EXPECT_EQ(read.channels, written.channels);
  EXPECT_EQ(read.rgb, written.rgb);
  EXPECT_EQ(read.channel_names, written.channel_names);
  EXPECT_EQ(read.sample_bits, written.sample_bits);
  ASSERT_EQ(read.intensity_windows.size(), written.intensity_windows.size());
  for (size_t i = 0; i < read.intensity_windows.size(); ++i) {
    EXPECT_EQ(read.intensity_windows[i].low, written.intensity_windows[i].low) << i;
    EXPECT_EQ(read.intensity_windows[i].high, written.intensity_windows[i].high) << i;
  }
  EXPECT_EQ(read.level, written.level);
  EXPECT_EQ(read.level_width, written.level_width);
  EXPECT_EQ(read.level_height, written.level_height);
  EXPECT_EQ(read.downsample, written.downsample);
  EXPECT_EQ(read.tile_size, written.tile_size);
  EXPECT_EQ(read.settings, written.settings);
  EXPECT_EQ(read.grid_columns, written.grid_columns);
  EXPECT_EQ(read.grid_rows, written.grid_rows);
  EXPECT_EQ(read.tissue, written.tissue);
  EXPECT_EQ(read.tissue_level, written.tissue_level);
  EXPECT_EQ(read.candidates, written.candidates);
  EXPECT_EQ(read.done, written.done);
  EXPECT_EQ(read.tiles, written.tiles);
  EXPECT_EQ(read.corrupt_tiles, written.corrupt_tiles);
  EXPECT_EQ(read.unannotated, written.unannotated);
  EXPECT_EQ(read.label_counts, written.label_counts);
  EXPECT_EQ(read.complete, written.complete);
}

// A 16-bit multiplex slide part-way through tiling: every field away from its default.
SlideRecord multiplex_record() {
  SlideRecord record;
  record.path = "/slides/panel.ome.tiff";
  record.name = "panel.ome.tiff";
  record.format = "ome-tiff";
  record.fingerprint = "size:123456 crc32:0a1b2c3d:4e5f6071";
  record.width = 40000;
  record.height = 30000;
  record.mpp_x = 0.2505;
  record.mpp_y = 0.2495;
  record.channels = 5;
  record.rgb = false;
  record.channel_names = {"DAPI", "CD3", "CD8", "panCK", "AF"};
  record.sample_bits = 16;
  record.intensity_windows = {{12, 3400}, {0, 65535}, {7, 900}, {100, 20000}, {1, 2}};
  record.level = 1;
  record.level_width = 10000;
  record.level_height = 7500;
  record.downsample = 4.000133;
  record.tile_size = 224;
  record.settings = {{"level", 1}, {"tile_size", 224}, {"min_tissue", 0.5}, {"intensity_window", {0, 4000}}};
  record.grid_columns = 44;
  record.grid_rows = 33;
  record.tissue = {{"stain", "fluorescence"}, {"chosen", "automatic"}, {"background", 31.5}};
  record.tissue_level = 4;
  record.candidates = 900;
  record.done = 700;
  record.tiles = 690;
  record.corrupt_tiles = 3;
  record.unannotated = 7;
  record.label_counts = {600, 0, 90};
  record.complete = false;
  return record;
}

// An entry of every field a store has always written for an RGB slide, and nothing else.
nlohmann::json plain_entry() {
  return {{"path", "/slides/a.svs"}, {"tile_size", 256}, {"channels", 3}, {"candidates", 3}, {"done", 3},
          {"tiles", 3}, {"label_counts", {{"0", 3}}}, {"complete", true}};
}

}  // namespace

TEST(SlideRecord, RoundTripsEveryFieldThroughJsonText) {
  const SlideRecord written = multiplex_record();
  // As the store keeps it: JSON text.
  nlohmann::json entry = nlohmann::json::parse(written.to_json().dump());
  expect_same_record(SlideRecord::from_json(entry, "here"), written);
  EXPECT_EQ(SlideRecord::from_json(entry, "here").to_json(), entry);
  EXPECT_EQ(entry["grid"], nlohmann::json({44, 33}));
  EXPECT_EQ(entry["rgb"], false);
  EXPECT_EQ(entry["intensity_windows"][0], nlohmann::json({12, 3400}));
  EXPECT_EQ(entry["label_counts"], nlohmann::json({{"0", 600}, {"2", 90}}));  // labels without tiles left out

  // A default record says nothing of grid, tissue, channel names, rgb or sample bits.
  SlideRecord plain = SlideRecord::from_json(plain_entry(), "here");
  nlohmann::json plain_json = plain.to_json();
  for (const char* field :
       {"grid", "tissue", "tissue_level", "channel_names", "rgb", "sample_bits", "intensity_windows"})
    EXPECT_FALSE(plain_json.contains(field)) << field;
  expect_same_record(SlideRecord::from_json(plain_json, "here"), plain);
}

TEST(SlideRecord, EntryOfAnOldStoreReadsWithTheDocumentedDefaults) {
  // As `tile` wrote a slide before rgb, fingerprint and grid were recorded.
  auto path = fresh_directory("old_entry");
  { TileStoreWriter writer(path.string()); }
  nlohmann::json old = {{"path", "/data/cases/old.svs"},
                        {"format", "openslide:aperio"},
                        {"channels", 3},
                        {"width", 46000},
                        {"height", 32914},
                        {"level", 0},
                        {"level_width", 46000},
                        {"level_height", 32914},
                        {"downsample", 1.0},
                        {"tile_size", 256},
                        {"mpp_x", 0.499},
                        {"mpp_y", 0.499},
                        {"settings", {{"level", 0}, {"tile_size", 256}}},
                        {"candidates", 10},
                        {"done", 10},
                        {"tiles", 9},
                        {"corrupt_tiles", 1},
                        {"label_counts", {{"0", 5}, {"1", 4}}},
                        {"complete", true}};
  put_slide_entry(path, 4, old);
  auto slides = TileStore(path.string()).slides();
  ASSERT_EQ(slides.count(4), 1u);
  const SlideRecord& record = slides.at(4);
  EXPECT_EQ(record.name, "old.svs");  // the path's file name
  EXPECT_EQ(record.fingerprint, "");
  EXPECT_TRUE(record.rgb);  // 3 channels were a colour image
  EXPECT_TRUE(record.channel_names.empty());
  EXPECT_EQ(record.sample_bits, 8);
  EXPECT_TRUE(record.intensity_windows.empty());
  EXPECT_EQ(record.grid_columns, 0);
  EXPECT_EQ(record.grid_rows, 0);
  EXPECT_TRUE(record.tissue.is_null());
  EXPECT_FALSE(record.tissue_level.has_value());
  EXPECT_EQ(record.label_counts, (std::vector<uint64_t>{5, 4}));
  EXPECT_EQ(record.class_count(), 2u);
  EXPECT_EQ(record.stem(), "old");
  // Written back, it says no more than it held (and its name).
  nlohmann::json again = record.to_json();
  EXPECT_FALSE(again.contains("grid") || again.contains("rgb") || again.contains("tissue"));
  EXPECT_EQ(again["fingerprint"], "");

  // Before `rgb` a slide of other than 3 channels was planes; an entry of a tile size alone
  // takes every default.
  nlohmann::json four = old;
  four["channels"] = 4;
  EXPECT_FALSE(SlideRecord::from_json(four, "here").rgb);
  SlideRecord bare = SlideRecord::from_json({{"tile_size", 64}}, "here");
  EXPECT_EQ(bare.channels, 3);
  EXPECT_TRUE(bare.rgb);
  EXPECT_EQ(bare.downsample, 1.0);
  EXPECT_EQ(bare.level, 0);
  EXPECT_FALSE(bare.complete);
  EXPECT_TRUE(bare.settings.is_null());
  EXPECT_TRUE(bare.label_counts.empty());
  EXPECT_EQ(bare.class_count(), 1u);
}

TEST(SlideRecord, MalformedEntriesAreRefusedNamingStoreSlideAndField) {
  auto path = fresh_directory("malformed_entry");
  { TileStoreWriter writer(path.string()); }
  struct Case {
    std::function<void(nlohmann::json&)> change;
    std::string message;  // after "STORE: slide 3: slide entry: "
  };
  const std::vector<Case> cases{
      {[](nlohmann::json& e) { e["width"] = "5"; }, "width is \"5\", not a whole number from 0 to 2147483648"},
      {[](nlohmann::json& e) { e["tile_size"] = -256; }, "tile_size is -256, not a whole number from 0 to 65535"},
      {[](nlohmann::json& e) { e["label_counts"] = {{"x", 3}}; }, "label_counts names 'x', not a class index"},
      {[](nlohmann::json& e) { e["label_counts"] = {{"0", 1}, {"1", 1}}; },
       "label_counts add up to 2, not its 3 tiles"},
      {[](nlohmann::json& e) { e["channels"] = 5, e["rgb"] = true; }, "rgb is true for 5 channels"},
      {[](nlohmann::json& e) { e["sample_bits"] = 16, e["intensity_windows"] = {{9, 3}}; },
       "intensity_windows holds [9,3], not [low, high] with low < high <= 65535"},
      {[](nlohmann::json& e) { e["corrupt_tiles"] = 1; },
       "tiles 3, corrupt_tiles 1 and unannotated 0 are more than its 3 candidates"},
      {[](nlohmann::json& e) { e["unannotated"] = 1; },
       "tiles 3, corrupt_tiles 0 and unannotated 1 are more than its 3 candidates"},
      // Counts whose sum wraps around 64 bits are still more than the candidates.
      {[](nlohmann::json& e) {
         const uint64_t half = (uint64_t{1} << 63) + 1;
         e["candidates"] = UINT64_MAX, e["tiles"] = half, e["label_counts"] = {{"0", half}};
         e["corrupt_tiles"] = half, e["unannotated"] = half;
       },
       "tiles 9223372036854775809, corrupt_tiles 9223372036854775809 and unannotated 9223372036854775809 are more "
       "than its 18446744073709551615 candidates"},
  };
  for (const Case& bad : cases) {
    nlohmann::json entry = plain_entry();
    bad.change(entry);
    put_slide_entry(path, 3, entry);
    try {
      TileStore(path.string()).slides();
      ADD_FAILURE() << "read " << entry.dump();
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find(path.string() + ": slide 3: slide entry: " + bad.message),
                std::string::npos)
          << e.what();
    }
  }
  // The entry corrected reads.
  put_slide_entry(path, 3, plain_entry());
  EXPECT_EQ(TileStore(path.string()).slides().at(3).tiles, 3u);
}
