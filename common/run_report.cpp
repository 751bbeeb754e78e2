#include "common/run_report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "common/error.h"
#include "common/files.h"
#include "common/json_input.h"
#include "common/output.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// A report lists every slide of a run; 256 MiB holds several hundred thousand.
constexpr uint64_t max_report_bytes = uint64_t{256} << 20;

const char* const temporary_suffix = ".partial";

// The fields of a report that `tessera report` reads, with what each must be.
class ReportChecks {
 public:
  explicit ReportChecks(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw BadInput(source_ + ": " + (field.empty() ? "" : field + ": ") + problem);
  }
  const nlohmann::json& member(const nlohmann::json& object, const std::string& key, const std::string& field,
                               nlohmann::json::value_t type, bool required) const {
    static const nlohmann::json absent;
    if (!object.contains(key)) {
      if (required) fail(field, "missing (not a tessera run report?)");
      return absent;
    }
    const nlohmann::json& value = object[key];
    bool fits = value.type() == type || (type == nlohmann::json::value_t::number_float && value.is_number()) ||
                (type == nlohmann::json::value_t::number_unsigned && value.is_number_integer() &&
                 value.get<int64_t>() >= 0);
    if (!fits) fail(field, "is " + json_excerpt(value) + ", not " + type_name(type));
    return value;
  }
  void one_of(const nlohmann::json& value, const std::string& field, const std::vector<std::string>& allowed) const {
    if (std::find(allowed.begin(), allowed.end(), value.get<std::string>()) != allowed.end()) return;
    std::string list;
    for (const std::string& name : allowed) list += (list.empty() ? "" : ", ") + name;
    fail(field, json_excerpt(value) + " is not one of " + list);
  }
  // Counts and rates: numbers >= 0 where given.
  void amounts(const nlohmann::json& object, const std::string& where, std::initializer_list<const char*> keys) const {
    for (const char* key : keys) {
      const nlohmann::json& value =
          member(object, key, where + key, nlohmann::json::value_t::number_float, false);
      if (value.is_number() && value.get<double>() < 0) fail(where + key, "is negative: " + json_excerpt(value));
    }
  }

 private:
  static std::string type_name(nlohmann::json::value_t type) {
    switch (type) {
      case nlohmann::json::value_t::string: return "a string";
      case nlohmann::json::value_t::array: return "an array";
      case nlohmann::json::value_t::object: return "an object";
      case nlohmann::json::value_t::number_unsigned: return "a whole number >= 0";
      default: return "a number";
    }
  }
  const std::string& source_;
};

}  // namespace

std::string runs_directory(const std::string& out) {
  if (fs::is_regular_file(out)) return out + ".runs";
  return (fs::path(out) / "runs").lexically_normal().string();
}

std::string utc_time(std::chrono::system_clock::time_point time, bool basic) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  const auto milliseconds =
      std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40] = {};
  std::strftime(text, sizeof text, basic ? "%Y%m%dT%H%M%S" : "%Y-%m-%dT%H:%M:%S", &utc);
  char fraction[8] = {};
  std::snprintf(fraction, sizeof fraction, ".%03dZ", static_cast<int>(milliseconds));
  return std::string(text) + fraction;
}

RunReportFile::RunReportFile(std::string out, std::chrono::system_clock::time_point started)
    : out_(std::move(out)), stem_(utc_time(started, true)) {}

std::string RunReportFile::write(const nlohmann::json& report) {
  if (!output_exists(out_)) return "";
  const std::string directory = runs_directory(out_);
  if (::mkdir(directory.c_str(), 0755) != 0 && errno != EEXIST) {
    int error = errno;
    throw Error(ExitCode::runtime_error, directory + ": cannot create: " + std::strerror(error) +
                                             (error == ENOSPC || error == EDQUOT ? disk_full_hint() : ""));
  }
  struct stat status {};
  if (::lstat(directory.c_str(), &status) != 0 || !S_ISDIR(status.st_mode))
    throw Error(ExitCode::runtime_error,
                directory + ": not a folder (a link, or a file); tessera never writes through links: remove it");
  // Named by the pid: two runs started in the same millisecond never share a temporary.
  const std::string temporary = directory + "/." + stem_ + "-" + std::to_string(::getpid()) + temporary_suffix;
  const std::string text = report.dump(1, '\t', false, nlohmann::json::error_handler_t::replace) + "\n";
  try {
    write_new_file(temporary, text);
    if (!path_.empty()) {
      durable_rename(temporary, path_);
      return path_;
    }
    for (int attempt = 1; attempt <= 1000; ++attempt) {
      std::string path = directory + "/" + stem_ + (attempt > 1 ? "-" + std::to_string(attempt) : "") + ".json";
      if (durable_link_new(temporary, path)) return path_ = path;
    }
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  ::unlink(temporary.c_str());
  throw Error(ExitCode::runtime_error, directory + ": 1000 reports named " + stem_ + "-N.json already; none is replaced");
}

std::vector<std::string> run_report_files(const std::string& out) {
  const std::string directory = runs_directory(out);
  std::error_code error;
  if (!fs::is_directory(directory, error))
    throw BadInput(out + ": no run reports: " + directory +
                   " does not exist (each tessera tile and extract run writes its report there)");
  // Sorted by start time, then by the "-N" of runs that started in the same millisecond.
  std::vector<std::pair<std::pair<std::string, int>, std::string>> found;
  for (fs::directory_iterator entry(directory, error), end; !error && entry != end; entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    if (name.starts_with(".") || !name.ends_with(".json") || !entry->is_regular_file(error)) continue;
    const std::string stem = name.substr(0, name.size() - 5);
    const size_t dash = stem.rfind('-');
    int attempt = 1;
    if (dash != std::string::npos && dash + 1 < stem.size() &&
        stem.find_first_not_of("0123456789", dash + 1) == std::string::npos && stem.size() - dash <= 5)
      attempt = std::stoi(stem.substr(dash + 1));
    found.push_back({{dash != std::string::npos && attempt > 1 ? stem.substr(0, dash) : stem, attempt},
                     entry->path().string()});
  }
  if (error) throw BadInput(directory + ": cannot list: " + error.message());
  if (found.empty()) throw BadInput(directory + ": holds no run report (*.json)");
  std::sort(found.begin(), found.end());
  std::vector<std::string> files;
  for (auto& [key, file] : found) files.push_back(file);
  return files;
}

nlohmann::json read_run_report(const std::string& file) {
  nlohmann::json report = read_json_file(file, file, max_report_bytes);
  check_run_report(report, file);
  return report;
}

void check_run_report(const nlohmann::json& report, const std::string& source) {
  using type = nlohmann::json::value_t;
  ReportChecks check(source);
  if (!report.is_object()) check.fail("", "not a JSON object (not a tessera run report)");
  const nlohmann::json& format = check.member(report, "format", "format", type::string, true);
  if (format != run_report_format) check.fail("format", json_excerpt(format) + ", not \"" + run_report_format + "\"");
  const nlohmann::json& version = check.member(report, "version", "version", type::number_unsigned, true);
  if (version.get<int64_t>() != run_report_version)
    check.fail("version", std::to_string(version.get<int64_t>()) + ": this tessera reads run reports of version " +
                              std::to_string(run_report_version) +
                              (version.get<int64_t>() > run_report_version ? " (written by a newer tessera)" : ""));
  for (const char* key : {"command", "started", "ended", "outcome"}) check.member(report, key, key, type::string, true);
  check.one_of(report["outcome"], "outcome", run_report_outcomes);
  for (const char* key : {"error", "tessera", "host", "out"}) check.member(report, key, key, type::string, false);
  check.member(report, "exit_code", "exit_code", type::number_unsigned, false);
  check.amounts(report, "", {"seconds"});
  const nlohmann::json& arguments = check.member(report, "arguments", "arguments", type::array, false);
  for (size_t i = 0; i < arguments.size(); ++i)
    if (!arguments[i].is_string())
      check.fail("arguments[" + std::to_string(i) + "]", "is " + json_excerpt(arguments[i]) + ", not a string");
  const nlohmann::json& devices = check.member(report, "devices", "devices", type::array, false);
  for (size_t i = 0; i < devices.size(); ++i) {
    const std::string where = "devices[" + std::to_string(i) + "]";
    if (!devices[i].is_object()) check.fail(where, "is " + json_excerpt(devices[i]) + ", not an object");
    for (const char* key : {"name", "driver", "type"}) check.member(devices[i], key, where + "." + key, type::string, false);
    check.amounts(devices[i], where + ".", {"busy_fraction", "batch", "slides", "tiles"});
  }
  const nlohmann::json& totals = check.member(report, "totals", "totals", type::object, true);
  check.amounts(totals, "totals.", {"slides", "tiles", "new_tiles", "seconds", "tiles_per_second",
                                    "device_busy_fraction", "data_wait_fraction"});
  const nlohmann::json& slides = check.member(report, "slides", "slides", type::array, true);
  for (size_t i = 0; i < slides.size(); ++i) {
    const std::string where = "slides[" + std::to_string(i) + "]";
    if (!slides[i].is_object()) check.fail(where, "is " + json_excerpt(slides[i]) + ", not an object");
    check.member(slides[i], "slide", where + ".slide", type::string, true);
    check.one_of(check.member(slides[i], "status", where + ".status", type::string, true), where + ".status",
                 run_report_statuses);
    for (const char* key : {"path", "error", "warning"}) check.member(slides[i], key, where + "." + key, type::string, false);
    check.amounts(slides[i], where + ".", {"tiles", "new_tiles", "resumed_from", "seconds", "tiles_per_second",
                                            "device_busy_fraction"});
  }
}

}  // namespace tessera
