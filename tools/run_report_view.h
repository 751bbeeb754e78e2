// `tessera report`: run reports (common/run_report.h) as tables for people, one JSON object for
// programs, and a self-contained HTML page; each with the cohort across the runs: every slide's
// last status, which are complete, and which failed last and why.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "common/run_report.h"

namespace tessera::cli {

// Per slide (by path, else name, in the order first seen) its last status other than "not
// started", the run that gave it, its tiles and why it failed; with counts of complete (done,
// resumed, already complete), failed (failed, skipped, in use) and not started slides.
nlohmann::json cohort_of(const RunReports& runs);

// A table per run (its slides by status, totals, tiles/s, the device's busy fraction), then the
// cohort.
std::string format_run_reports(const RunReports& runs);

// {"directory", "runs": [{"file", "report"}...], "unfinished", "cohort"}: each report as its file
// holds it.
nlohmann::json run_reports_json(const RunReports& runs);

// One page: the cohort, then each run's table (rows with data-status and data-slide attributes).
std::string run_reports_html(const RunReports& runs, const std::string& title);

}  // namespace tessera::cli
