// Slides into the LMDB tile store: tissue detection, labels, decoding and encoding on worker
// threads, large transactions in key order; a killed run, started again, ends with the same tiles.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checked.h"
#include "common/run_report.h"

#include "data/labels.h"
#include "data/slide.h"
#include "data/tile_format.h"
#include "data/tissue.h"

namespace tessera::data {

struct TilerOptions {
  int size = 256;
  int level = 0;
  double min_tissue = 0.5;
  int tissue_threshold = default_tissue_threshold;  // saturation 0-255, or signal above the background
  Stain tissue = Stain::automatic;
  LabelOptions labelling;  // how --labels become tile labels, and what becomes of unannotated tissue
  bool allow_empty_labels = false;  // labels that give no tile a class: a warning, not an error
  TileEncoding encoding = TileEncoding::jpeg;
  int quality = 90;
  int workers = 1;
  uint64_t commit_bytes = uint64_t{64} << 20;  // a transaction commits at this many value bytes
  size_t commit_tiles = 8192;                  // ... or this many tiles
  uint64_t tile_cache_bytes = uint64_t{64} << 20;
  // 16-bit channels: one window for every channel of every slide (--intensity-window), so that
  // slides compare; unset, each channel's own from its slide (slide_planes.cpp).
  std::optional<IntensityWindow> intensity_window;
};

struct SlideJob {
  std::string slide;
  std::string labels;  // empty: every tile gets label 0
};

// One of `count` parts of a cohort, for the tasks of a job array (`--shard K/N`, K from 0 as
// SLURM_ARRAY_TASK_ID counts).
struct Shard {
  uint32_t index = 0, count = 1;
};

// Parses "K/N" with 0 <= K < N; throws UsageError naming --shard otherwise.
Shard parse_shard(const std::string& text);

// Parses "LOW,HIGH" (16-bit sample values, LOW < HIGH); throws UsageError naming --intensity-window.
IntensityWindow parse_intensity_window(const std::string& text);

// --intensity-window maps 16-bit channels to 8 bits. Where every slide is 8-bit it would change
// nothing: UsageError naming the flag and the slides. Where some are, a warning (report()) names
// those it leaves as they are. Nothing without a window.
void check_intensity_window_applies(const std::vector<const Slide*>& slides,
                                    const std::optional<IntensityWindow>& window, const std::string& task);

// Refuses, through `size_field` (a flag: exit 2; a file's field: exit 5), a tile side of more than a
// tile header holds, or tiles of `size` pixels of `channels` bytes a pixel of more than
// max_tile_pixel_bytes, naming the slide.
void check_tile_bytes(const Field& size_field, const std::string& slide, int64_t size, int64_t channels);

// The positions in `slides` that belong to `shard`: the slides sorted by absolute path, the i-th
// belongs to shard i mod count, so the N shards divide the list without overlap or gaps whatever
// its order. Throws UsageError naming `flag` when a slide is listed twice.
std::vector<size_t> shard_members(const std::vector<std::string>& slides, const Shard& shard, const std::string& flag);

// Tiles each slide into the store at `store` (created if needed), resuming slides a previous
// run left unfinished and skipping finished ones. Throws BadInput naming the file when a slide
// or label file cannot be read (before any tile is written); corrupt tiles are reported,
// counted and skipped, as are tiles no annotation claims (`unannotated`). A run that fails
// before it stores a tile removes the store it created; a slide entry that holds no tile is
// tiled again by a run with other settings. Returns the summary. `observer`, where given, is
// told the slides once the store is open, and each slide's summary as it ends (a slide whose
// error ends the run: "failed" with the error), for the run report.
nlohmann::json tile_slides(const std::vector<SlideJob>& jobs, const std::string& store, const TilerOptions& options,
                           SlideObserver* observer = nullptr);

}  // namespace tessera::data
