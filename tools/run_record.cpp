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
  return object.contains(key) && object[key].is_number() ? object[key].get<double>() : otherwise;
}

// A tile slide: "tiled" is done; `written` are the tiles new this run.
nlohmann::json tile_slide(const nlohmann::json& slide) {
  const std::string path = slide.value("slide", "");
  std::string status = slide.value("status", "");
  nlohmann::json entry = {{"slide", std::filesystem::path(path).filename().string()},
                          {"path", path},
                          {"status", status == "tiled" ? "done" : status}};
  if (slide.contains("tiles")) entry["tiles"] = slide["tiles"];
  if (status == "tiled" || status == "resumed" || status == "already complete")
    entry["new_tiles"] = slide.value("written", uint64_t{0});
  for (const char* key : {"resumed_from", "seconds", "tiles_per_second", "error", "warning"})
    if (slide.contains(key)) entry[key] = slide[key];
  return entry;
}

// An extract slide: "extracted" is done; a failed slide the run went past (--skip-errors) is
// skipped; one in flight when an error ended the run ("interrupted") failed.
nlohmann::json extract_slide(const nlohmann::json& slide, bool skip_errors) {
  std::string status = slide.value("status", "");
  if (status == "extracted") status = "done";
  else if (status == "interrupted") status = "failed";
  else if (status == "failed" && skip_errors) status = "skipped";
  nlohmann::json entry = {{"slide", slide.value("slide", "")}, {"path", slide.value("path", "")}, {"status", status}};
  if (slide.contains("tiles")) {
    const uint64_t tiles = slide["tiles"].get<uint64_t>(), from = slide.value("resumed_from", uint64_t{0});
    entry.update({{"tiles", tiles}, {"new_tiles", tiles - std::min(tiles, from)}, {"resumed_from", from}});
  }
  for (const char* key : {"file", "seconds", "tiles_per_second", "error", "device"})
    if (slide.contains(key)) entry[key] = slide[key];
  if (slide.contains("times")) {
    entry["times"] = slide["times"];
    // The device's share of the slide's time: running the models over its tiles.
    const double seconds = number_or(slide, "seconds", 0);
    entry["device_busy_fraction"] = seconds > 0 ? number_or(slide["times"], "device_seconds", 0) / seconds : 0.0;
  }
  if (status == "already complete") entry["new_tiles"] = 0;
  return entry;
}

// Totals over the slides, with the summary's rates where the run got that far, else the whole
// run's seconds.
nlohmann::json report_totals(const nlohmann::json& slides, const nlohmann::json& summary, double run_seconds) {
  std::map<std::string, uint64_t> statuses;
  uint64_t tiles = 0, fresh = 0;
  for (const nlohmann::json& slide : slides) {
    ++statuses[slide["status"].get<std::string>()];
    tiles += slide.value("tiles", uint64_t{0});
    fresh += slide.value("new_tiles", uint64_t{0});
  }
  const double seconds = number_or(summary, "seconds", run_seconds);
  nlohmann::json totals = {{"slides", slides.size()},
                           {"statuses", statuses},
                           {"tiles", tiles},
                           {"new_tiles", fresh},
                           {"seconds", seconds},
                           {"tiles_per_second", number_or(summary, "tiles_per_second",
                                                          seconds > 0 ? static_cast<double>(fresh) / seconds : 0.0)}};
  for (const char* key : {"device_busy_fraction", "data_wait_fraction", "decoded_tiles", "times", "workers"})
    if (summary.contains(key)) totals[key] = summary[key];
  return totals;
}

// The devices an extract run used, each with its driver and how busy it was.
nlohmann::json report_devices(const nlohmann::json& summary) {
  nlohmann::json devices = nlohmann::json::array();
  if (!summary.contains("devices")) return devices;
  const double seconds = number_or(summary, "seconds", 0);
  for (const nlohmann::json& device : summary["devices"]) {
    nlohmann::json entry = nlohmann::json::object();
    for (const char* key : {"index", "name", "type", "driver", "batch", "slides", "tiles"})
      if (device.contains(key)) entry[key] = device[key];
    entry["busy_fraction"] = seconds > 0 ? number_or(device, "device_seconds", 0) / seconds : 0.0;
    devices.push_back(entry);
  }
  return devices;
}

}  // namespace

nlohmann::json report_slides(const std::string& command, const nlohmann::json& summary) {
  nlohmann::json slides = nlohmann::json::array();
  if (!summary.contains("slides")) return slides;
  for (const nlohmann::json& slide : summary["slides"])
    slides.push_back(command == "tile" ? tile_slide(slide) : extract_slide(slide, summary.contains("skipped")));
  return slides;
}

void with_run_report(const CLI::App& command, const std::string& out,
                     const std::function<void(nlohmann::json& summary)>& work) {
  const auto started = std::chrono::system_clock::now();
  const auto clock_start = std::chrono::steady_clock::now();
  nlohmann::json arguments = nlohmann::json::array();
  for (const std::string& argument : process_arguments()) arguments.push_back(valid_utf8(argument));
  std::error_code ignored;
  nlohmann::json report = {{"format", run_report_format},
                           {"version", run_report_version},
                           {"command", command.get_name()},
                           {"tessera", tessera_version},
                           {"arguments", arguments},
                           {"settings", settings_of(command)},
                           {"host", valid_utf8(host_name())},
                           {"pid", ::getpid()},
                           {"cpus", std::thread::hardware_concurrency()},
                           {"out", valid_utf8(std::filesystem::absolute(out, ignored).string())},
                           {"started", utc_time(started)}};
  nlohmann::json summary = nlohmann::json::object();
  std::exception_ptr error;
  try {
    work(summary);
  } catch (...) {
    error = std::current_exception();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
  report.update({{"ended", utc_time(started + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                   std::chrono::duration<double>(seconds)))},
                 {"seconds", seconds},
                 {"outcome", error ? "failed" : "complete"},
                 {"exit_code", 0}});
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      report.update({{"exit_code", exit_code_of(e)}, {"error", valid_utf8(e.what())}});
    } catch (...) {
      report.update({{"exit_code", static_cast<int>(ExitCode::runtime_error)}, {"error", "an unknown error"}});
    }
  }
  report["devices"] = report_devices(summary);
  report["slides"] = report_slides(command.get_name(), summary);
  report["totals"] = report_totals(report["slides"], summary, seconds);
  report["summary"] = summary;
  try {
    if (std::string path = write_run_report(out, report, started); !path.empty())
      tessera::report(command.get_name(), {{"run report", path}});
  } catch (const std::exception& e) {
    tessera::report(command.get_name(), {{"warning", std::string("no run report written: ") + e.what()}});
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace tessera::cli
