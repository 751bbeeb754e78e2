// `tessera report`: a run report (common/run_report.h) as a table for people and as a
// self-contained HTML page (every string from the report escaped).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace tessera::cli {

// The run's heading, when and where it ran, its devices and command line, a table of its slides
// (status, tiles, new tiles, seconds, tiles/s, for extract the device's busy fraction) with the
// totals, then why each slide failed. `file` is the report's path (its name names the run).
std::string format_run_report(const nlohmann::json& report, const std::string& file);

// The same as one HTML page: no outside resource; rows carry class (the status) and data-slide.
std::string run_report_html(const nlohmann::json& report, const std::string& file);

}  // namespace tessera::cli
