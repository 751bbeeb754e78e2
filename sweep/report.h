// What a study holds, for people and for other tools: a summary, a table, CSV, JSON and an SVG
// of the optimisation history and of each parameter against the objective.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "sweep/store.h"

namespace tessera::sweep {

// The complete trial with the best value, if any.
const Trial* best_trial(const std::vector<Trial>& trials, Direction direction);

// Counts by state and the best trial, a few lines.
std::string format_summary(const std::vector<Trial>& trials, Direction direction);
// One row per trial, then the best parameters as train flags.
std::string format_table(const std::vector<Trial>& trials, const StudyConfig& config);

std::string export_csv(const std::vector<Trial>& trials, const StudyConfig& config);
std::string export_json(const std::vector<Trial>& trials, const StudyConfig& config);
std::string export_svg(const std::vector<Trial>& trials, const StudyConfig& config);

}  // namespace tessera::sweep
