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

#include "common/error.h"
#include "common/output.h"
#include "compute/hdf5.h"

namespace tessera {

struct FeatureFileLayout {
  std::string name;  // the slide
  int64_t patch_size = 0, patch_level = 0;
  double downsample = 1;                      // level-0 pixels per pixel of patch_level
  int64_t level_width = 0, level_height = 0;  // patch_level's size
  int64_t width = 0;                          // D
  bool fp16 = false, gzip = false;
  // The model's identity (a hash of its weights, whether they are random, the layer, pooling,
  // precision, tile size) and the slide's (its path, the fingerprint of its bytes, the tiling
  // settings, the tile count): stored as the attributes `extraction` and `slide` of `features`.
  // A file is complete only for the same of both (the model's path aside), and a partial file
  // written otherwise starts afresh.
  nlohmann::json extraction, slide;
  // What CLAM's and TRIDENT's readers take beside the above (feature_file.cpp,
  // "CLAM and TRIDENT attributes").
  int64_t level0_width = 0, level0_height = 0;
  std::string encoder;  // the model (and layer) that made the features
  // TRIDENT's magnifications, as its users filter on them: level 0's (trident_magnification of
  // the slide's pixel size) and the patches' (an encoder's own, a level's, a coordinates file's:
  // jobs/extract_inputs.cpp); neither is written when level0_magnification is 0 (no pixel size).
  // target_magnification is written as an integer when it is whole.
  int64_t level0_magnification = 0;
  double target_magnification = 0;
};

// TRIDENT's magnification of a level-0 pixel size in microns (WSI._fetch_magnification's buckets:
// below 0.16 um/px 80x, 0.2 60x, 0.3 40x, 0.6 20x, 1.2 10x, 2.4 5x); 0 when unknown or coarser.
int64_t trident_magnification(double mpp);

// What a feature file at a path holds against what a run would write there.
enum class FeatureFileState {
  absent,    // nothing there
  complete,  // this slide's features, made as this run makes them
  other,     // another slide's features, or features made otherwise (another model, layer...)
};

// The state of the feature file at `path` for `layout`; for `other`, `difference` (if given)
// says what the file holds against what this run makes.
FeatureFileState feature_file_state(const std::string &path, const FeatureFileLayout &layout,
                                    std::string *difference = nullptr);

// Throws UsageError (exit 2) when the feature file at `path` is `other` for `layout` and
// `existing` is not overwrite: the run would replace another slide's features, or features
// made otherwise.
void check_feature_file_replaceable(const std::string &path, const FeatureFileLayout &layout, Existing existing);

class FeatureFileWriter {
 public:
  // Locks `path` for this run (OutputLock: throws Error naming the run that holds it). When
  // `path` is complete for `layout` there is nothing to write (complete()); when it holds
  // something else, throws UsageError unless `existing` is overwrite. Then opens `path`.partial,
  // resuming after its last flushed row when it was written with the same layout, and otherwise
  // creating it new.
  FeatureFileWriter(const std::string &path, const FeatureFileLayout &layout, Existing existing);
  ~FeatureFileWriter();
  FeatureFileWriter(const FeatureFileWriter &) = delete;
  FeatureFileWriter &operator=(const FeatureFileWriter &) = delete;

  // The final file was complete already: nothing to append or finish.
  bool complete() const { return complete_; }
  // Rows already in the file: where this writer appends (a complete file: all of them).
  int64_t rows() const { return rows_; }
  // Appends `count` rows (features [count,D] float32, coords [count,2]) and
  // flushes them to disk; throws a runtime error naming the file when the disk
  // refuses (what was flushed stays). A fp16 file takes to_half's bits (tensor.h). A value that
  // is not finite (or, in fp16, past 65504) is BadInput naming the slide, the tile and the
  // feature, once the rows before its tile are written.
  void append(const float *features, const int64_t *coords, int64_t count);
  // Closes the file and renames it to `path`.
  void finish();

 private:
  bool resume(const FeatureFileLayout &layout);
  void create(const FeatureFileLayout &layout);
  void record_rows();
  void close();
  // Why the value at `column` of the next row (at `coords`) cannot be written.
  BadInput refusal(float value, int64_t column, const int64_t *coords) const;

  std::string path_, partial_, rows_path_, slide_name_;
  OutputLock lock_;
  hid_t file_ = -1, features_ = -1, coords_ = -1;
  int64_t rows_ = 0, width_ = 0;
  bool fp16_ = false, complete_ = false;
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

// The encoder a feature file names (the attribute `encoder` of `features`, as extract writes it),
// or empty where it names none (CLAM's and TRIDENT's files) or cannot be read.
std::string feature_file_encoder(const std::string &path);

}  // namespace tessera
