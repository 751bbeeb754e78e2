// Per-slide feature files in CLAM's layout (docs/architecture.md, "Formats"):
// `features` float32 or float16 [N,D] and `coords` int64 [N,2] (level-0 x, y),
// chunked and extendable, with CLAM's and TRIDENT's attributes on `coords`
// (strings as variable-length UTF-8, which h5py reads as str). Written as
// <file>.partial, appended and flushed batch by batch, and renamed when
// complete.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compute/hdf5.h"

namespace tessera {

struct FeatureFileLayout {
  std::string name;  // the slide
  int64_t patch_size = 0, patch_level = 0;
  double downsample = 1;                      // level-0 pixels per pixel of patch_level
  int64_t level_width = 0, level_height = 0;  // patch_level's size
  int64_t width = 0;                          // D
  bool fp16 = false, gzip = false;
  // Model, layer, pooling: stored as an attribute; a partial file written
  // otherwise starts afresh.
  nlohmann::json extraction;
  // What CLAM's and TRIDENT's readers take beside the above (feature_file.cpp,
  // "CLAM and TRIDENT attributes").
  int64_t level0_width = 0, level0_height = 0;
  double mpp = 0;       // microns per level-0 pixel; 0 when the slide does not say
  std::string encoder;  // the model (and layer) that made the features
};

class FeatureFileWriter {
 public:
  // Opens `path`.partial, resuming after its last flushed row when it was
  // written with the same layout, and otherwise creating it.
  FeatureFileWriter(const std::string &path, const FeatureFileLayout &layout);
  ~FeatureFileWriter();
  FeatureFileWriter(const FeatureFileWriter &) = delete;
  FeatureFileWriter &operator=(const FeatureFileWriter &) = delete;

  // Rows already in the file: where this writer appends.
  int64_t rows() const { return rows_; }
  // Appends `count` rows (features [count,D] float32, coords [count,2]) and
  // flushes them to disk; throws a runtime error naming the file when the disk
  // refuses (what was flushed stays).
  void append(const float *features, const int64_t *coords, int64_t count);
  // Closes the file and renames it to `path`.
  void finish();

 private:
  bool resume(const FeatureFileLayout &layout);
  void create(const FeatureFileLayout &layout);
  void record_rows();
  void close();

  std::string path_, partial_, rows_path_;
  hid_t file_ = -1, features_ = -1, coords_ = -1;
  int64_t rows_ = 0, width_ = 0;
};

// Where a feature file's tiles lie on its slide: `coords` and the attributes on it.
struct FeatureFileTiles {
  std::vector<int64_t> coords;  // [N,2] level-0 x, y of each tile's top-left corner
  int64_t patch_size = 0, patch_level = 0;
  double downsample = 1;  // level-0 pixels per pixel of patch_level (x)
  // The slide the file records (attributes name and level_dim); empty and 0 when it does not.
  std::string name;
  int64_t level_width = 0, level_height = 0;
  // A tile's side in level-0 pixels.
  double extent() const { return static_cast<double>(patch_size) * downsample; }
};

// Throws BadInput naming the file when it is missing or corrupt, or when coords or its
// attributes patch_size, patch_level and downsample are missing or malformed; name and
// level_dim are read when present.
FeatureFileTiles read_feature_tiles(const std::string &path);

// Throws UsageError (exit 2) when the complete feature file at `path` was made with other
// settings (model, layer, precision...) than `extraction`: a run into a directory of such
// files must not keep them as if they were its own.
void check_same_extraction(const std::string &path, const nlohmann::json &extraction);

}  // namespace tessera
