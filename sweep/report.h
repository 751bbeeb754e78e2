// What a study holds, for people and for other tools: a summary, a table, CSV, JSON, an SVG of
// the optimisation history and of each parameter against the objective, and an HTML page.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sweep/store.h"

namespace tessera::sweep {

// The complete trial with the best value, if any.
const Trial* best_trial(const std::vector<Trial>& trials, Direction direction);

// The searched flags of a trial as its last attempt ran them, as train flags.
std::string best_flags(const Trial& trial, const StudyConfig& config);
// The --checkpoint the trial's last attempt wrote, if any.
std::optional<std::string> best_checkpoint(const Trial& trial);
// Seconds the trial's attempts ran.
double trial_seconds(const Trial& trial);

// Counts by state and the best trial, a few lines.
std::string format_summary(const std::vector<Trial>& trials, Direction direction);
// The same as a JSON record: `event` "sweep", `trials`, `states` (counts by state), `best`.
nlohmann::json summary_json(const std::vector<Trial>& trials, Direction direction);
// A finished attempt's record for people: "trial 3  complete  value 0.8123  12s".
std::string trial_line(const nlohmann::json& event);
// One row per trial, then the best parameters as train flags.
std::string format_table(const std::vector<Trial>& trials, const StudyConfig& config);

std::string export_csv(const std::vector<Trial>& trials, const StudyConfig& config);
nlohmann::json study_json(const std::vector<Trial>& trials, const StudyConfig& config);
std::string export_json(const std::vector<Trial>& trials, const StudyConfig& config);
std::string export_svg(const std::vector<Trial>& trials, const StudyConfig& config);
// One self-contained page; `study_name` is its title.
std::string export_html(const std::vector<Trial>& trials, const StudyConfig& config, const std::string& study_name);

}  // namespace tessera::sweep
