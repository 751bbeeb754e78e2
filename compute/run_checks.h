// Checks the training jobs make on their data and on what they are about to save, kept apart
// from the training loops so that each loop calls them in one line.
#pragma once
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "compute/checkpoint.h"
#include "compute/trainer.h"
#include "data/patches.h"

namespace tessera {

// Throws Diverged (exit 4) naming the first parameter or optimizer state that holds NaN or an
// infinity after `epoch`: a diverged run must not pass for a trained one, nor replace the last
// good checkpoint.
void check_finite_state(const std::map<std::string, HostArray>& params, const std::map<std::string, HostArray>& train,
                        int epoch);

// Throws BadInput (exit 5) naming `data` when its labels do not fit a model of `classes`
// outputs (labels are class indices in [0, classes)).
void check_labels_fit(const data::PatchSource& source, int64_t classes, const std::string& data);

// The settings of a run that a resumed run must share (ARCHITECTURE.md: a resumed run
// continues exactly), saved in the checkpoint's progress record beside the epoch.
nlohmann::json run_settings(const TrainOptions& options);

// Throws UsageError when the training split is too small for one optimizer step, saying
// why (validation may have taken whole slides) and what to change.
void check_training_patches(const data::PatchSource& source, const TrainOptions& options, size_t train_patches,
                            size_t val_patches);

}  // namespace tessera
