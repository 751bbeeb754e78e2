// The LMDB tile store: key order, checksummed values, map growth, the PatchSource view.
#include <gtest/gtest.h>
#include <lmdb.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "common/error.h"
#include "data/jpeg.h"
#include "data/patches.h"
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
                    key.column * 256,
                    key.row * 256};
  return {key, encode_tile_value(header, rgb.data(), rgb.size())};
}

nlohmann::json entry(int size, std::map<std::string, int> label_counts) {
  return {{"tile_size", size}, {"label_counts", label_counts}, {"complete", true}};
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
  EXPECT_EQ(value.header.x, 768u);
  EXPECT_EQ(value.header.y, 512u);
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
    writer.commit(0, entry(32, {{"0", 1}, {"1", 2}}), slide0);
    writer.commit(1, entry(32, {{"0", 1}, {"2", 1}}), {raw_tile({1, 0, 5, 5}, 32, 2), raw_tile({1, 0, 5, 6}, 32, 0)});
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
  TileStoreWriter(path.string()).commit(0, entry(8, {{"0", 1}}), {raw_tile({0, 0, 0, 0}, 8, 0)});
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
  auto with_fingerprint = [](std::string fingerprint, int tiles) {
    auto described = entry(8, {{"0", tiles}});
    described["fingerprint"] = fingerprint;
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
  writer.commit(0, entry(256, {{"0", 20}, {"1", 20}}), tiles);  // about 7.5 MiB into a 1 MiB map
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
  writer.commit(1, entry(8, {{"0", 1}}), {raw_tile({1, 0, 0, 0}, 8, 0)});
  writer.commit(0, entry(8, {{"0", 2}}), {raw_tile({0, 0, 0, 0}, 8, 0), raw_tile({0, 0, 3, 3}, 8, 0)});
  auto store = open_tile_store(path.string());
  ASSERT_EQ(store->size(), 3u);
  EXPECT_EQ(store->group(0), 0u);
  EXPECT_EQ(store->group(2), 1u);
}

TEST(TileStore, CorruptValueNamesItsKey) {
  auto path = fresh_directory("corrupt");
  TileStoreWriter(path.string())
      .commit(0, entry(16, {{"0", 3}}),
              {raw_tile({0, 0, 0, 0}, 16, 0), raw_tile({0, 0, 1, 2}, 16, 0), raw_tile({0, 0, 4, 4}, 16, 0)});
  // Flip one pixel byte of the middle tile behind the store's back, as bad media would.
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 2);
  ASSERT_EQ(mdb_env_open(env, path.c_str(), 0, 0664), 0);
  MDB_txn* txn = nullptr;
  MDB_dbi tiles;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  ASSERT_EQ(mdb_dbi_open(txn, "tiles", 0, &tiles), 0);
  auto key_bytes = encode_tile_key({0, 0, 1, 2});
  MDB_val key{key_bytes.size(), key_bytes.data()}, value;
  ASSERT_EQ(mdb_get(txn, tiles, &key, &value), 0);
  std::vector<uint8_t> bytes(static_cast<uint8_t*>(value.mv_data),
                             static_cast<uint8_t*>(value.mv_data) + value.mv_size);
  bytes[tile_header_size + 5] ^= 0xff;
  MDB_val corrupted{bytes.size(), bytes.data()};
  ASSERT_EQ(mdb_put(txn, tiles, &key, &corrupted, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);

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
