// Feature extraction: a model run up to a named layer over every tile of each
// slide of a tile store, one CLAM-layout feature file per slide
// (compute/feature_file.h).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tiler.h"

namespace tessera {

struct ExtractOptions {
  std::string model;                // checkpoint .h5 or preset
  std::string layer;                // a layer or module name ("layer4")
  std::vector<std::string> slides;  // tiled into <out>/tiles.lmdb first
  std::vector<std::string> tiles;   // or existing tile stores (or directories of them)
  data::Shard shard;                // only this part of the slides
  std::string out;
  int batch = 32;
  int device = -1;             // --device (-1: the default one)
  std::vector<int> devices;    // --devices: slides spread over these, one model each
  int workers = 2;  // threads decoding tiles
  uint64_t memory_budget = 0;  // --device-memory-limit per device (0: what the device reports)
  bool fp16 = false, gzip = false;
  bool overwrite = false;  // --overwrite: replace feature files that hold something else
  data::TilerOptions tiler;  // for `slides`
};

// Writes <out>/<slide>.h5 for every slide of the shard not finished before, resuming partial
// files. A slide whose tiles cannot be read fails alone: the others finish,
// then BadInput names it. Prints the summary (per slide, throughput, time spent
// in HDF5 writes) as a JSON line on stdout.
void extract_features(const ExtractOptions &options);

}  // namespace tessera
