#include "tools/run_record.h"

#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <map>
#include <thread>

#include "common/error.h"
#include "common/output.h"
#include "common/progress.h"
#include "common/run_report.h"
#include "common/utf8.h"
#include "common/version.h"
#include "tools/commands.h"

namespace tessera::cli {

namespace {

// Every flag of the command with its value: as given, else its default where CLI11 knows it.
nlohmann::json settings_of(const CLI::App& command) {
  nlohmann::json settings = nlohmann::json::object();
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_lnames().empty() || option->get_lnames().front() == "help") continue;
    const std::string name = "--" + option->get_lnames().front();
    if (option->count() > 0 && option->get_type_size() == 0) {
      settings[name] = true;
    } else if (option->count() > 0) {
      nlohmann::json values = nlohmann::json::array();
      for (const std::string& value : option->results()) values.push_back(valid_utf8(value));
      settings[name] = values.size() == 1 ? values.front() : values;
    } else if (!option->get_default_str().empty()) {
      settings[name] = valid_utf8(option->get_default_str());
    }
  }
  return settings;
}

double number_or(const nlohmann::json& object, const char* key, double otherwise) {
  return object.is_object() && object.contains(key) && object[key].is_number() ? object[key].get<double>() : otherwise;
}

std::string error_text(const std::exception_ptr& error, int* code) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    *code = exit_code_of(e);
    return valid_utf8(e.what());
  } catch (...) {
    *code = static_cast<int>(ExitCode::runtime_error);
    return "an unknown error";
  }
}

// A run's devices as the report gives them; `busy_fraction`: device seconds over `seconds`.
nlohmann::json report_devices(const nlohmann::json& devices, double seconds) {
  nlohmann::json out = nlohmann::json::array();
  for (const nlohmann::json& device : devices) {
    nlohmann::json entry = nlohmann::json::object();
    for (const char* key : {"index", "name", "type", "driver", "batch", "slides", "tiles"})
      if (device.contains(key))
        entry[key] = device[key].is_string() ? nlohmann::json(valid_utf8(device[key].get<std::string>())) : device[key];
    if (device.contains("device_seconds") && seconds > 0)
      entry["busy_fraction"] = number_or(device, "device_seconds", 0) / seconds;
    out.push_back(entry);
  }
  return out;
}

// The report of one run, kept as the run goes and written after each slide.
class RunRecorder : public SlideObserver {
 public:
  RunRecorder(const CLI::App& command, const std::string& out)
      : command_(command.get_name()), started_(std::chrono::system_clock::now()),
        clock_start_(std::chrono::steady_clock::now()), file_(out, started_) {
    nlohmann::json arguments = nlohmann::json::array();
    for (const std::string& argument : process_arguments()) arguments.push_back(valid_utf8(argument));
    std::error_code ignored;
    report_ = {{"format", run_report_format},
               {"version", run_report_version},
               {"command", command_},
               {"tessera", version()},
               {"commit", commit()},
               {"arguments", arguments},
               {"settings", settings_of(command)},
               {"host", valid_utf8(host_name())},
               {"pid", ::getpid()},
               {"cpus", std::thread::hardware_concurrency()},
               {"out", valid_utf8(std::filesystem::absolute(out, ignored).string())},
               {"started", utc_time(started_)},
               {"devices", nlohmann::json::array()},
               {"slides", nlohmann::json::array()}};
  }

  void devices_chosen(const nlohmann::json& devices) override {
    report_["devices"] = report_devices(devices, 0);
    write(false);
  }
  void slides_listed(const nlohmann::json& slides) override {
    listed_ = true;
    report_["slides"] = nlohmann::json::array();
    for (const nlohmann::json& slide : slides) report_["slides"].push_back(report_slide(command_, slide));
    write(false);
  }
  void slide_ended(size_t index, const nlohmann::json& summary) override {
    if (index < report_["slides"].size()) report_["slides"][index] = report_slide(command_, summary);
    write(false);
  }

  // The last write: the command's whole summary (its slides, devices and rates), how it ended.
  void finish(const nlohmann::json& summary, const std::exception_ptr& error) {
    report_["outcome"] = error ? "failed" : "complete";
    report_["exit_code"] = 0;
    if (error) {
      int code = 0;
      report_["error"] = error_text(error, &code);
      report_["exit_code"] = code;
    }
    if (summary.contains("slides") && summary["slides"].size() == report_["slides"].size()) {
      for (size_t i = 0; i < summary["slides"].size(); ++i)
        report_["slides"][i] = report_slide(command_, summary["slides"][i]);
    }
    if (summary.contains("devices"))
      report_["devices"] = report_devices(summary["devices"], number_or(summary, "seconds", 0));
    summary_ = summary;
    write(true);
  }

 private:
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start_).count();
  }

  // Totals over the slides; the summary's rates where the run got that far.
  nlohmann::json totals(double seconds) const {
    std::map<std::string, uint64_t> statuses;
    uint64_t tiles = 0, fresh = 0;
    double device_seconds = 0;
    for (const nlohmann::json& slide : report_["slides"]) {
      ++statuses[slide["status"].get<std::string>()];
      tiles += slide.value("tiles", uint64_t{0});
      fresh += slide.value("new_tiles", uint64_t{0});
      if (slide.contains("times")) device_seconds += number_or(slide["times"], "device_seconds", 0);
    }
    const double run_seconds = number_or(summary_, "seconds", seconds);
    nlohmann::json totals = {{"slides", report_["slides"].size()},
                             {"statuses", statuses},
                             {"tiles", tiles},
                             {"new_tiles", fresh},
                             {"seconds", run_seconds},
                             {"tiles_per_second", run_seconds > 0 ? static_cast<double>(fresh) / run_seconds : 0.0}};
    if (command_ == "extract") {  // the device's share of the wall time, from the pipeline's accounting
      const double device_wall = run_seconds * static_cast<double>(std::max<size_t>(1, report_["devices"].size()));
      totals["device_busy_fraction"] =
          number_or(summary_, "device_busy_fraction", device_wall > 0 ? device_seconds / device_wall : 0.0);
      for (const char* key : {"data_wait_fraction", "times", "decoded_tiles", "workers"})
        if (summary_.contains(key)) totals[key] = summary_[key];
    }
    return totals;
  }

  // Writes the report; before the last write the run reads as "interrupted": what stays of it if
  // the process is killed. A report that cannot be written is said once, as a warning.
  void write(bool last) {
    const double seconds = elapsed();
    if (!last) report_["outcome"] = "interrupted";
    report_["ended"] = utc_time(started_ + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                               std::chrono::duration<double>(seconds)));
    report_["seconds"] = seconds;
    report_["totals"] = totals(seconds);
    if (last) report_["summary"] = summary_;
    // A run refused before it made its output (bad flags, an input it cannot read) leaves nothing.
    if (failed_ || !listed_) return;
    // Before any tile is stored, a tile run leaves nothing in the store (which a failure removes).
    if (!last && command_ == "tile" && report_["totals"]["tiles"] == 0) return;
    try {
      std::string path = file_.write(report_);
      if (last && !path.empty()) tessera::report(command_, {{"run report", path}});
    } catch (const std::exception& e) {
      failed_ = true;
      tessera::report(command_, {{"warning", std::string("no run report written: ") + e.what()}});
    }
  }

  std::string command_;
  std::chrono::system_clock::time_point started_;
  std::chrono::steady_clock::time_point clock_start_;
  RunReportFile file_;
  nlohmann::json report_, summary_ = nlohmann::json::object();
  bool listed_ = false, failed_ = false;
};

}  // namespace

nlohmann::json report_slide(const std::string& command, const nlohmann::json& slide) {
  const std::string path = valid_utf8(slide.value("path", slide.value("slide", std::string())));
  std::string status = slide.value("status", "");
  // The commands' own words: tile "tiled", extract "extracted", both "already complete" and
  // extract "in use" (its error names the other run).
  if (status == "tiled" || status == "extracted") status = "done";
  else if (status == "already complete") status = "skipped";
  else if (status == "in use") status = "failed";
  const std::string name = command == "tile" ? std::filesystem::path(path).filename().string()
                                             : valid_utf8(slide.value("slide", std::string()));
  nlohmann::json entry = {{"slide", name}, {"path", path}, {"status", status}};
  if (slide.contains("tiles")) {
    const uint64_t tiles = slide["tiles"].get<uint64_t>();
    const uint64_t from = slide.value("resumed_from", uint64_t{0});
    // tile counts the tiles it wrote (corrupt ones skipped); extract the rows past where it resumed.
    const uint64_t fresh = status == "skipped" ? 0
                           : command == "tile" ? slide.value("written", uint64_t{0})
                                               : tiles - std::min(tiles, from);
    entry.update({{"tiles", tiles}, {"new_tiles", fresh}, {"resumed_from", from}});
  }
  for (const char* key : {"file", "seconds", "tiles_per_second", "device"})
    if (slide.contains(key)) entry[key] = slide[key];
  for (const char* key : {"error", "warning"})
    if (slide.contains(key) && slide[key].is_string()) entry[key] = valid_utf8(slide[key].get<std::string>());
  if (slide.contains("times")) {
    entry["times"] = slide["times"];
    // The device's share of its time on the slide (the pipeline's accounting: from the slide's
    // first message to its last, waiting for tiles included): running the models over its tiles.
    const double wall = number_or(slide["times"], "device_wall_seconds", 0);
    entry["device_busy_fraction"] = wall > 0 ? number_or(slide["times"], "device_seconds", 0) / wall : 0.0;
  }
  return entry;
}

void with_run_report(const CLI::App& command, const std::string& out,
                     const std::function<void(nlohmann::json& summary, SlideObserver& observer)>& work) {
  RunRecorder recorder(command, out);
  nlohmann::json summary = nlohmann::json::object();
  std::exception_ptr error;
  try {
    work(summary, recorder);
  } catch (...) {
    error = std::current_exception();
  }
  recorder.finish(summary, error);
  if (error) std::rethrow_exception(error);
}

}  // namespace tessera::cli
