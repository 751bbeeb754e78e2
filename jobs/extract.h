// Feature extraction: each slide's tiles through one or more models (a network up to a named
// layer, or patch encoders), one CLAM-layout feature file per slide and model
// (compute/feature_file.h). Tiles are read live from the slides (--slides: no tile store, nothing
// re-encoded; --coords: at another tool's coordinates) or from tile stores (--tiles).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compute/inference.h"
#include "data/tiler.h"

namespace tessera {

struct ExtractOptions {
  // Checkpoints or presets (one for --layer); with `encoders`, their weights in the same order
  // (empty with random_weights).
  std::vector<std::string> models;
  std::vector<std::string> encoders;  // ViT presets or model JSONs (jobs/encoder_input.h)
  bool random_weights = false;
  double mpp = 0;                   // microns per level-0 pixel of slides that do not give theirs
  bool dry_run = false;             // print the plans and check them against the budget; nothing else
  std::string layer;                // a layer or module name ("layer4")
  std::vector<std::string> slides;  // read live
  std::string coords;               // with slides: a directory of CLAM's or TRIDENT's patch coordinates
  std::vector<std::string> tiles;   // or tile stores (or directories of them)
  data::Shard shard;                // only this part of the slides
  std::string out;
  int batch = 0;                    // --batch; 0: chosen for each model and device (jobs/batch_choice.h)
  int device = -1;             // --device (-1: the default one)
  std::vector<int> devices;    // --devices: slides spread over these, the models on each
  int workers = 1;             // threads reading, decoding and resizing tiles (over all devices)
  uint64_t memory_budget = 0;  // --device-memory-limit per device (0: what the device reports)
  bool fp16 = false, gzip = false;
  // --weights fp16 (encoders only): their large weights stored on the device in fp16
  // (compute/inference.h, InferenceOptions::weights).
  bool fp16_weights = false;
  // --stream-weights (encoders only): the transformer blocks' weights kept in host memory and
  // streamed through the device where they do not fit its budget (compute/weight_stream.h).
  WeightStreaming stream_weights = WeightStreaming::automatic;
  bool overwrite = false;    // --overwrite: replace feature files that hold something else
  bool skip_errors = false;  // a slide that cannot be read is reported and the run goes on
  data::TilerOptions tiler;  // the grid and tissue detection of --slides
};

// The threads that read tiles by default: the cores less one (the one that drives the device).
int default_extract_workers();

// Writes each model's feature file of every slide of the shard not finished before, resuming
// partial files; prints the summary (per slide and in total: tiles/s, where the time went, the
// device-busy and data-wait fractions, the tiles decoded) as a JSON line on stdout. A slide that
// cannot be opened throws BadInput before any work; one whose tiles cannot be read stops the run
// after the slides in flight (BadInput; the slides before it complete), and so does one whose
// features are not finite (FeatureFileWriter::append; its partial files stay, never renamed).
// With skip_errors each is named in the summary's `skipped` and the others go on (no error).
// `summary_so_far`, where given, holds the summary as far as the run got when it throws (each
// slide's status; those in flight when an error ended it "interrupted"): what its report records.
// `observer`, where given, is told the slides once the output folder exists, and each slide's
// summary as it ends.
void extract_features(const ExtractOptions &options, nlohmann::json *summary_so_far = nullptr,
                      SlideObserver *observer = nullptr);

}  // namespace tessera
