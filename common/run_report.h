// Run reports (docs/architecture.md, "Run reports"): every `tile` and `extract` run leaves
// OUT/runs/<start, UTC>.json, what it did with each slide, rewritten as each slide ends so that a
// killed run leaves a valid report marked "interrupted"; `tessera report` reads them back. The
// file's writer, its one reader and what a run tells as it goes live here (data's tiler and
// jobs' extraction both tell it).
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera {

// The `format` and `version` fields that make a JSON file a run report.
inline constexpr const char* run_report_format = "tessera run report";
inline constexpr int run_report_version = 1;

// What became of a slide in a run: done (finished by this run from its start), resumed (finished
// from where a killed run stopped), skipped (complete before this run: nothing to do), failed
// (with its error; --skip-errors went on past it, or it ended the run), interrupted (in flight
// when an error ended the run), not started.
inline const std::vector<std::string> run_report_statuses = {"done",   "resumed",     "skipped",
                                                            "failed", "interrupted", "not started"};

// A run's outcome: complete, failed (an error ended it: `error`, `exit_code`), or interrupted (the
// report of a run still going, or of one killed before it could say how it ended).
inline const std::vector<std::string> run_report_outcomes = {"complete", "failed", "interrupted"};

// What a run tells as it goes. Calls come one at a time (a run with several devices serialises them).
class SlideObserver {
 public:
  virtual ~SlideObserver() = default;
  // Every slide of the run, in order, each {"slide", "path", "status": "not started"}: called once
  // the run's output exists, before the first slide starts.
  virtual void slides_listed(const nlohmann::json& slides) = 0;
  // Slide `index` of that list ended: the command's own summary of it (with "status").
  virtual void slide_ended(size_t index, const nlohmann::json& summary) = 0;
  // The devices the run uses, each {"index", "name", "type", "driver", "batch", ...}, once chosen.
  virtual void devices_chosen(const nlohmann::json& devices) { (void)devices; }
};

// The folder of OUT's reports: OUT/runs, or for a tile store in one file (LMDB's MDB_NOSUBDIR)
// STORE.runs beside it.
std::string runs_directory(const std::string& out);

// `time` in UTC as ISO 8601 to the millisecond: "2026-11-27T10:15:00.123Z", or with `basic`
// "20261127T101500.123Z" (a file name: no colon).
std::string utc_time(std::chrono::system_clock::time_point time, bool basic = false);

// One run's report file: runs/<started, basic>.json, written whole each time through a temporary
// made new (O_EXCL, never through a link) and renamed. The first write gives the file its name
// only where no file has it (link(2): another run's report is never replaced; "-2", "-3"... are
// tried); later writes replace this run's own file.
class RunReportFile {
 public:
  RunReportFile(std::string out, std::chrono::system_clock::time_point started);

  // Writes `report`; nothing while OUT does not exist (a run refused before it made its output
  // leaves nothing). Returns the report's path, or "" where nothing was written. Throws Error
  // (exit 1) naming the file when it cannot be written (runs/ a link or not a folder, a full disk).
  std::string write(const nlohmann::json& report);

  const std::string& path() const { return path_; }

 private:
  std::string out_, stem_, path_;
};

// The report files in runs_directory(out), newest (latest start) last; temporaries left out.
// Throws BadInput (exit 5) naming OUT when it holds none.
std::vector<std::string> run_report_files(const std::string& out);

// Reads and checks one report: BadInput (exit 5) naming the file (and the field) when it is not
// JSON or not a run report of this version (another tool's file, a newer format, a truncated file).
nlohmann::json read_run_report(const std::string& file);

// Refuses (BadInput naming `source` and the field) what is not a run report of this version.
void check_run_report(const nlohmann::json& report, const std::string& source);

}  // namespace tessera
