// What a `tile` or `extract` run leaves in its report (common/run_report.h, docs/architecture.md
// "Run reports"): its command line and flags, tessera's version, the devices and drivers, and
// each slide's status, rewritten as each slide ends and once more however the run ends.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/run_report.h"

namespace tessera::cli {

// Runs `work`, which fills `summary` as it goes (tile_slides' and extract_features' summaries so
// far) and tells `observer` of each slide, then writes OUT's run report, whether `work` returned
// or threw, and rethrows. A report that cannot be written is a warning: the run's own outputs
// stand, and so does its exit code.
void with_run_report(const CLI::App& command, const std::string& out,
                     const std::function<void(nlohmann::json& summary, SlideObserver& observer)>& work);

// A report's slide from a `tile` or `extract` slide summary: name, path, status (the vocabulary of
// run_report_statuses), tiles in the output and new this run, seconds, tiles/s, why it failed,
// and for extract the device's busy fraction and where the time went.
nlohmann::json report_slide(const std::string& command, const nlohmann::json& slide);

}  // namespace tessera::cli
