#include "common/run_report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

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
  std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32] = {};
  std::strftime(text, sizeof text, basic ? "%Y%m%dT%H%M%SZ" : "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string write_run_report(const std::string& out, const nlohmann::json& report,
                             std::chrono::system_clock::time_point started) {
  if (!output_exists(out)) return "";
  const std::string directory = runs_directory(out);
  if (::mkdir(directory.c_str(), 0755) != 0 && errno != EEXIST) {
    int error = errno;
    throw Error(ExitCode::runtime_error, directory + ": cannot create: " + std::strerror(error) +
                                             (error == ENOSPC || error == EDQUOT ? disk_full_hint() : ""));
  }
  struct stat status {};
  if (::lstat(directory.c_str(), &status) != 0 || !S_ISDIR(status.st_mode))
    throw Error(ExitCode::runtime_error,
                directory + ": not a directory (a link, or a file); tessera never writes through links: remove it");
  const std::string stem = utc_time(started, true) + "-" + std::to_string(::getpid());
  const std::string temporary = directory + "/." + stem + ".json" + temporary_suffix;
  try {
    write_new_file(temporary, report.dump(1, '\t', false, nlohmann::json::error_handler_t::replace) + "\n");
    for (int attempt = 1; attempt <= 1000; ++attempt) {
      std::string path = directory + "/" + stem + (attempt > 1 ? "-" + std::to_string(attempt) : "") + ".json";
      if (durable_link_new(temporary, path)) return path;
    }
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  ::unlink(temporary.c_str());
  throw Error(ExitCode::runtime_error, directory + ": 1000 reports named " + stem + "-N.json already; none is replaced");
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
                              std::to_string(run_report_version) + (version.get<int64_t>() > run_report_version
                                                                        ? " (written by a newer tessera)"
                                                                        : ""));
  for (const char* key : {"command", "started", "ended", "outcome"}) check.member(report, key, key, type::string, true);
  if (report["outcome"] != "complete" && report["outcome"] != "failed")
    check.fail("outcome", json_excerpt(report["outcome"]) + ", not \"complete\" or \"failed\"");
  for (const char* key : {"error", "tessera", "host", "out"}) check.member(report, key, key, type::string, false);
  check.member(report, "exit_code", "exit_code", type::number_unsigned, false);
  check.amounts(report, "", {"seconds"});
  for (const char* key : {"arguments", "devices"}) {
    const nlohmann::json& list = check.member(report, key, key, type::array, false);
    const bool strings = std::string(key) == "arguments";
    for (size_t i = 0; i < list.size(); ++i)
      if (strings ? !list[i].is_string() : !list[i].is_object())
        check.fail(std::string(key) + "[" + std::to_string(i) + "]",
                   "is " + json_excerpt(list[i]) + ", not " + (strings ? "a string" : "an object"));
  }
  const nlohmann::json& totals = check.member(report, "totals", "totals", type::object, true);
  check.amounts(totals, "totals.", {"slides", "tiles", "new_tiles", "seconds", "tiles_per_second",
                                    "device_busy_fraction", "data_wait_fraction"});
  const nlohmann::json& slides = check.member(report, "slides", "slides", type::array, true);
  for (size_t i = 0; i < slides.size(); ++i) {
    const std::string where = "slides[" + std::to_string(i) + "]";
    if (!slides[i].is_object()) check.fail(where, "is " + json_excerpt(slides[i]) + ", not an object");
    check.member(slides[i], "slide", where + ".slide", type::string, true);
    const nlohmann::json& status = check.member(slides[i], "status", where + ".status", type::string, true);
    if (std::find(run_report_statuses.begin(), run_report_statuses.end(), status.get<std::string>()) ==
        run_report_statuses.end())
      check.fail(where + ".status", json_excerpt(status) + " is not a slide status of a run report");
    for (const char* key : {"path", "error"}) check.member(slides[i], key, where + "." + key, type::string, false);
    check.amounts(slides[i], where + ".", {"tiles", "new_tiles", "resumed_from", "seconds", "tiles_per_second",
                                            "device_busy_fraction"});
  }
}

RunReports read_run_reports(const std::string& path) {
  RunReports found;
  if (fs::is_regular_file(path) && ends_with(path, ".json")) {
    found.directory = fs::path(path).parent_path().string();
    found.files.push_back(path);
  } else {
    found.directory = runs_directory(path);
    std::error_code error;
    if (!fs::is_directory(found.directory, error))
      throw BadInput(path + ": no run reports: " + found.directory +
                     " does not exist (each tessera tile and extract run writes its report there)");
    for (fs::directory_iterator entry(found.directory, error), end; !error && entry != end; entry.increment(error)) {
      const std::string name = entry->path().filename().string();
      if (!entry->is_regular_file(error)) continue;
      if (ends_with(name, temporary_suffix)) found.unfinished.push_back(entry->path().string());
      else if (ends_with(name, ".json")) found.files.push_back(entry->path().string());
    }
    if (error) throw BadInput(found.directory + ": cannot list: " + error.message());
    std::sort(found.files.begin(), found.files.end());
    std::sort(found.unfinished.begin(), found.unfinished.end());
  }
  if (found.files.empty()) throw BadInput(found.directory + ": holds no run report (*.json)");
  for (const std::string& file : found.files) {
    found.reports.push_back(read_json_file(file, file, max_report_bytes));
    check_run_report(found.reports.back(), file);
  }
  // In the order the runs started (the names sort so, save for runs of one second).
  std::vector<size_t> order(found.files.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return found.reports[a]["started"].get<std::string>() < found.reports[b]["started"].get<std::string>();
  });
  RunReports sorted{found.directory, {}, {}, found.unfinished};
  for (size_t i : order) {
    sorted.files.push_back(found.files[i]);
    sorted.reports.push_back(std::move(found.reports[i]));
  }
  return sorted;
}

}  // namespace tessera
