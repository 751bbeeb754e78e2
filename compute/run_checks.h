// Checks the training loop makes on what it is about to save, and the settings a resumed run
// must share; kept apart from the loop so that it calls each in one line.
#pragma once
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "compute/checkpoint.h"
#include "compute/trainer.h"

namespace tessera {

// Throws Diverged (exit 4) naming the first parameter or optimizer state that holds NaN or an
// infinity after `epoch`: a diverged run must not pass for a trained one, nor replace the last
// good checkpoint.
void check_finite_state(const std::map<std::string, HostArray>& params, const std::map<std::string, HostArray>& train,
                        int epoch);

// The settings of a run that a resumed run must share (ARCHITECTURE.md: a resumed run
// continues exactly), the job's own among them, saved in the checkpoint's progress record
// beside the epoch.
nlohmann::json run_settings(const TrainOptions& options);

}  // namespace tessera
