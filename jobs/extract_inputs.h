// What an extraction reads, settled before any work: its models, and for each slide of the shard
// where its tiles come from (the slide itself, another tool's coordinates, or a tile store) and
// at which level and size each model reads them. Slides are opened here, once, and checked;
// their tissue is found later, on the reader thread, at the slide's turn.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/feature_file.h"
#include "compute/inference.h"
#include "data/patch_coords.h"
#include "data/slide.h"
#include "data/slide_record.h"
#include "data/tile_source.h"
#include "data/tile_store.h"
#include "jobs/encoder_input.h"
#include "jobs/extract.h"

namespace tessera {

// One model of the run, whatever the device.
struct ExtractModel {
  std::string name;     // the encoder as given, or the model and layer ("resnet50.h5:layer3")
  std::string folder;   // where its feature files go: --out, or --out/<name> with several models
  std::string weights;  // --model (empty: random weights)
  ResolvedModel resolved;
  std::optional<EncoderInput> encoder;
  int input_size = 0;  // pixels a side it reads: an encoder's image_size; a CNN's, the tiles'
  int channels = 3;
};

// --encoder and --model (or --random-weights) as the run's models, checked but not yet resolved:
// no weights are read (read_extract_weights does, once every slide is checked). Throws
// UsageError (exit 2) naming the flag for an encoder named twice or unknown, a count of models
// that does not match, or a flag that does not fit them.
std::vector<ExtractModel> resolve_extract_models(const ExtractOptions& options);

// Each model's graph and weights (a checkpoint is read whole here: gigabytes for an encoder's).
void read_extract_weights(std::vector<ExtractModel>& models);

// One way a slide is read: squares of record.tile_size pixels of record.level, for the models
// (indices into the run's) that read it there, each at its input size.
struct SlideRead {
  data::SlideRecord record;
  std::vector<size_t> models;
  std::vector<int> input_sizes;  // distinct
};

// One slide of the run.
struct SlideInput {
  std::string path;  // as given, or as its store records it
  std::string name;  // its feature files' name: the file name without its extension
  std::shared_ptr<const data::Slide> slide;  // read live...
  std::optional<data::PatchCoords> coords;   // ... at these coordinates, else on the tissue grid
  const data::TileStore* store = nullptr;    // ... or from a store
  uint32_t store_id = 0;
  std::vector<SlideRead> reads;
  std::string error;  // why it cannot be read (--skip-errors); then nothing else is set
};

struct ExtractInputs {
  std::vector<ExtractModel> models;
  std::vector<std::unique_ptr<data::TileStore>> stores;
  std::vector<SlideInput> slides;  // the shard's, in order
  size_t shard_of = 0;             // the slides of every shard
};

// Opens every slide of the shard (or store entry) once and decides its reads; the models' input
// sizes and channels are set from the slides. A slide that cannot be opened, lacks its pixel
// size (UsageError naming --mpp) or whose coordinates do not fit it throws, naming it; with
// --skip-errors it is kept with its error instead.
ExtractInputs gather_extract_inputs(const ExtractOptions& options, std::vector<ExtractModel> models);

// The tiles of `read` for the reader thread: from the store, at the coordinates, or the tissue
// grid (its tissue found once per tile extent: `masks`).
std::unique_ptr<data::TileSource> open_slide_read(const SlideInput& slide, const SlideRead& read,
                                                  const ExtractOptions& options,
                                                  std::map<double, std::optional<data::TissueMask>>& masks);

// The feature file of `slide`'s `read` for a model whose identity is `extraction`.
FeatureFileLayout feature_layout(const SlideInput& slide, const SlideRead& read, const ExtractModel& model,
                                 const nlohmann::json& extraction, const ExtractOptions& options);

// <folder>/<slide name>.h5
std::string feature_path(const ExtractModel& model, const SlideInput& slide);

}  // namespace tessera
