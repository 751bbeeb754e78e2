// Run reports (docs/architecture.md, "Run reports"): every `tile` and `extract` run leaves
// OUT/runs/<start>-<pid>.json, what it did with each slide, written when it ends, failed or not;
// `tessera report` reads them back. The format's writer and its one reader live here.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera {

// The `format` and `version` fields that make a JSON file a run report.
inline constexpr const char* run_report_format = "tessera run report";
inline constexpr int run_report_version = 1;

// What became of a slide in a run: done (finished by this run from the start), resumed (finished
// from where a killed run stopped), already complete (finished before), skipped (unreadable,
// and --skip-errors went on), failed (it stopped the run, or the run stopped while it was in
// flight), not started (after a failure), in use (another run writes its output).
inline const std::vector<std::string> run_report_statuses = {"done",    "resumed",     "already complete", "skipped",
                                                            "failed",  "not started", "in use"};

// The folder of OUT's reports: OUT/runs, or for a tile store in one file (LMDB's MDB_NOSUBDIR)
// STORE.runs beside it.
std::string runs_directory(const std::string& out);

// `time` in UTC as ISO 8601: "2026-11-27T10:15:00Z", or with `basic` "20261127T101500Z" (file names).
std::string utc_time(std::chrono::system_clock::time_point time, bool basic = false);

// Writes `report` as the report of this process's run on OUT, started at `started`:
// runs/<started, basic>-<pid>.json, made as runs/.<name>.partial (created new, never through a
// link: a run killed meanwhile leaves at most that temporary) and given its name only where no
// file has it (another run's report is never replaced: "-2", "-3"... are tried). Nothing where
// OUT does not exist (a run refused before it made its output leaves nothing). Returns the
// report's path, or "" where nothing was written; throws Error (exit 1) naming the file when it
// cannot be written (runs/ a link or not a directory, a full disk).
std::string write_run_report(const std::string& out, const nlohmann::json& report,
                             std::chrono::system_clock::time_point started);

// The reports `tessera report` reads: a report file itself, or every *.json in
// runs_directory(path), in the order the runs started.
struct RunReports {
  std::string directory;                 // where they were found
  std::vector<std::string> files;        // each report's path ...
  std::vector<nlohmann::json> reports;   // ... and what it holds, checked
  std::vector<std::string> unfinished;   // temporaries (*.partial): a run writing its report, or killed while it did
};

// Throws BadInput (exit 5) naming the path when it holds no reports, and naming the file and the
// field when one is not JSON or not a run report (another tool's file, a newer format).
RunReports read_run_reports(const std::string& path);

// Refuses (BadInput naming `source` and the field) what is not a run report of this version.
void check_run_report(const nlohmann::json& report, const std::string& source);

}  // namespace tessera
