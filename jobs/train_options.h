// The flags of `tessera train` as the training jobs take them, and what of them the shared
// loop sees (compute/training_job.h's LoopSettings) and saves (the run's settings, which a
// resumed run must share).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/training_job.h"

namespace tessera {

struct TrainOptions {
  std::vector<std::string> data;  // a PCam-layout HDF5 file, or tile stores / a directory of them
  std::string model = "small-cnn";  // preset, model JSON, or checkpoint .h5 to start from
  int width = 32;                   // channel width of small-cnn
  int epochs = 1;
  int batch = 0;                    // the micro-batch on the device at once; 0: chosen (jobs/batch_choice.h)
  int accumulate = 1;               // micro-batches per optimizer step
  OptimizerConfig optimizer;
  uint32_t seed = 0;
  double val_fraction = 0.1;
  // --val-fraction not given: where its default holds out nothing or leaves a class out of
  // validation on a small cohort, the split falls back and says so (data/split.h; jobs/mil.cpp
  // holds out a slide of each class).
  bool val_fraction_default = false;
  std::vector<float> class_weights;
  bool augment = false;
  int workers = 2;
  std::string checkpoint;
  bool resume = false;
  bool dry_run = false;
  // Settings of the job's own flags that a resumed run must share, by name (a slide-level
  // head's features, labels and head); saved beside run_settings' in the checkpoint.
  nlohmann::json job_settings = nlohmann::json::object();
  bool fp16 = false;             // --precision fp16
  bool sync_batch_norm = false;  // --sync-bn
};

// The settings of a run that a resumed run must share (docs/architecture.md: a resumed run
// continues exactly), the job's own among them, saved in the checkpoint's progress record
// beside the epoch.
nlohmann::json run_settings(const TrainOptions& options);

// What the training loop computes with.
LoopSettings loop_settings(const TrainOptions& options);

}  // namespace tessera
