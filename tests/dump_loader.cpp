// Writes what tessera's loader yields for tile stores, for a test to compare with another reader
// (tests/test_python_tile_store.py, tests/test_python_slide_record.py): one unshuffled,
// unaugmented epoch of data::Loader over every patch, the patches' groups and validation split,
// each store's tiles as TileStore reads them (origins checked against their headers), and each
// slide's record as SlideRecord reads it and writes it back (to_json(from_json(entry))).
// Usage: dump_loader OUT_DIR VAL_FRACTION STORE... (stores, or directories of them, as train --data)
// OUT_DIR gets pixels.u8 (N x H x W x C), labels.u32, groups.u64, split.json, tiles.jsonl and
// records.jsonl.
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/split.h"
#include "data/tile_store.h"

using namespace tessera;

namespace {

template <class T>
void write_array(const std::string& path, const std::vector<T>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
  if (!out) throw std::runtime_error(path + ": cannot write");
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s OUT_DIR VAL_FRACTION STORE...\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const double fraction = std::stod(argv[2]);
  std::vector<std::string> given(argv + 3, argv + argc);
  auto source = data::open_patches(given);

  std::vector<size_t> indices(source->size());
  std::iota(indices.begin(), indices.end(), 0);
  data::LoaderOptions options;
  options.batch = 7;  // a short last batch too
  options.shuffle = false;
  options.drop_last = false;
  data::Loader loader(*source, indices, options);
  std::vector<uint8_t> pixels;
  std::vector<uint32_t> labels;
  data::Batch batch;
  loader.start_epoch(0);
  const size_t patch = static_cast<size_t>(source->height()) * source->width() * source->channels();
  while (loader.next(batch)) {
    pixels.insert(pixels.end(), batch.images.begin(), batch.images.begin() + static_cast<long>(batch.count * patch));
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.begin() + static_cast<long>(batch.count));
  }
  std::vector<uint64_t> groups;
  for (size_t i = 0; i < source->size(); ++i) groups.push_back(source->group(i));
  data::GroupSplit split = data::split_by_group(*source, fraction);
  write_array(out + "/pixels.u8", pixels);
  write_array(out + "/labels.u32", labels);
  write_array(out + "/groups.u64", groups);
  std::ofstream(out + "/split.json") << nlohmann::json{{"count", source->size()},
                                                       {"height", source->height()},
                                                       {"width", source->width()},
                                                       {"channels", source->channels()},
                                                       {"class_count", source->class_count()},
                                                       {"train", split.train},
                                                       {"validation", split.validation}}.dump();

  std::ofstream tiles(out + "/tiles.jsonl"), records(out + "/records.jsonl");
  for (const std::string& path : data::find_tile_stores(given, "--data")) {
    data::TileStore store(path);
    for (auto& [slide, record] : store.slides()) {
      records << nlohmann::json{{"store", path}, {"slide", slide}, {"record", record.to_json()}}.dump() << "\n";
      auto slide_tiles = store.tiles(slide, record);
      for (size_t index = 0; index < slide_tiles->size(); ++index) {
        uint32_t label = slide_tiles->read(index, nullptr);  // checks the header against the record
        data::TileOrigin origin = slide_tiles->origin(index);
        tiles << nlohmann::json{{"store", path}, {"slide", slide}, {"slide_path", record.path},
                                {"level", record.level}, {"x", origin.x}, {"y", origin.y}, {"label", label}}
                     .dump()
              << "\n";
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dump_loader: %s\n", e.what());
  return 1;
}
