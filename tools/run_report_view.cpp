#include "tools/run_report_view.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "common/html.h"
#include "common/progress.h"

namespace tessera::cli {

namespace {

using Cells = std::vector<std::string>;

// A run's name: its report's file name without .json (its start time and pid).
std::string run_name(const std::string& file) { return std::filesystem::path(file).stem().string(); }

std::string cell(const nlohmann::json& object, const char* key) {
  return object.contains(key) ? format_number(object[key]) : "-";
}

std::string percent(const nlohmann::json& object, const char* key) {
  if (!object.contains(key) || !object[key].is_number()) return "-";
  return std::to_string(std::lround(object[key].get<double>() * 100)) + "%";
}

bool has_device(const nlohmann::json& report) { return report["command"] == "extract"; }

bool complete(const std::string& status) {
  return status == "done" || status == "resumed" || status == "already complete";
}

// "2 done, 1 skipped": the slides by status, in the order of run_report_statuses.
std::string statuses_text(const nlohmann::json& slides) {
  std::map<std::string, size_t> counts;
  for (const nlohmann::json& slide : slides) ++counts[slide["status"].get<std::string>()];
  std::string text;
  for (const std::string& status : run_report_statuses)
    if (counts.contains(status)) text += (text.empty() ? "" : ", ") + std::to_string(counts[status]) + " " + status;
  return text.empty() ? "no slides" : text;
}

Cells header(const nlohmann::json& report) {
  Cells cells = {"slide", "status", "tiles", "new", "seconds", "tiles/s"};
  if (has_device(report)) cells.push_back("busy");
  return cells;
}

Cells slide_cells(const nlohmann::json& report, const nlohmann::json& slide) {
  Cells cells = {slide["slide"].get<std::string>(), slide["status"].get<std::string>(), cell(slide, "tiles"),
                 cell(slide, "new_tiles"), cell(slide, "seconds"), cell(slide, "tiles_per_second")};
  if (has_device(report)) cells.push_back(percent(slide, "device_busy_fraction"));
  return cells;
}

Cells total_cells(const nlohmann::json& report) {
  const nlohmann::json& totals = report["totals"];
  Cells cells = {"total", statuses_text(report["slides"]), cell(totals, "tiles"), cell(totals, "new_tiles"),
                 cell(totals, "seconds"), cell(totals, "tiles_per_second")};
  if (has_device(report)) cells.push_back(percent(totals, "device_busy_fraction"));
  return cells;
}

// Why a slide failed or was skipped, or what its run warned of.
std::string why(const nlohmann::json& slide) {
  if (slide.contains("error")) return slide["error"].get<std::string>();
  if (slide.contains("warning") && slide["warning"].is_string()) return "warning: " + slide["warning"].get<std::string>();
  return "";
}

std::string heading(const nlohmann::json& report, const std::string& file) {
  std::string text = report["command"].get<std::string>() + " run " + run_name(file) + ": " +
                     report["outcome"].get<std::string>();
  if (report["outcome"] == "failed" && report.contains("exit_code"))
    text += " (exit " + format_number(report["exit_code"]) + ")";
  return text;
}

// When, how long, which tessera where, and the devices with their drivers.
std::vector<std::string> details(const nlohmann::json& report) {
  std::vector<std::string> lines;
  std::string line = "started " + report["started"].get<std::string>() + ", " + cell(report, "seconds") + " s";
  if (report.contains("tessera")) line += "; tessera " + report["tessera"].get<std::string>();
  if (report.contains("host")) line += " on " + report["host"].get<std::string>();
  if (report.contains("cpus")) line += " (" + format_number(report["cpus"]) + " cpus)";
  lines.push_back(line);
  for (const nlohmann::json& device : report.value("devices", nlohmann::json::array())) {
    std::string text = "device " + cell(device, "index") + ": " + device.value("name", std::string("?"));
    if (device.contains("type") || device.contains("driver"))
      text += " (" + device.value("type", std::string()) +
              (device.contains("driver") ? "; driver " + device["driver"].get<std::string>() : "") + ")";
    text += ", busy " + percent(device, "busy_fraction");
    if (device.contains("batch")) text += ", batch " + format_number(device["batch"]);
    lines.push_back(text);
  }
  if (report.contains("arguments")) {
    std::string command;
    for (const nlohmann::json& argument : report["arguments"]) command += (command.empty() ? "" : " ") +
                                                                           argument.get<std::string>();
    lines.push_back(command);
  }
  return lines;
}

std::string cohort_line(const nlohmann::json& cohort) {
  return format_number(cohort["slides"].size()) + " slides in " + format_number(cohort["runs"]) + " runs: " +
         format_number(cohort["complete"]) + " complete, " + format_number(cohort["failed"]) + " failed, " +
         format_number(cohort["not_started"]) + " not started";
}

}  // namespace

nlohmann::json cohort_of(const RunReports& runs) {
  std::vector<std::string> order;
  std::map<std::string, nlohmann::json> slides;
  for (size_t r = 0; r < runs.reports.size(); ++r)
    for (const nlohmann::json& slide : runs.reports[r]["slides"]) {
      const std::string path = slide.value("path", std::string());
      const std::string key = path.empty() ? slide["slide"].get<std::string>() : path;
      auto [entry, fresh] = slides.try_emplace(key, nlohmann::json{{"slide", slide["slide"]}, {"path", path}});
      if (fresh) order.push_back(key);
      nlohmann::json& known = entry->second;
      const std::string status = slide["status"];
      if (status == "not started" && known.contains("status")) continue;  // what an earlier run did stands
      known.update({{"status", status}, {"run", run_name(runs.files[r])}});
      known.erase("error");
      known.erase("tiles");
      if (slide.contains("error")) known["error"] = slide["error"];
      if (slide.contains("tiles")) known["tiles"] = slide["tiles"];
    }
  nlohmann::json cohort = {{"runs", runs.reports.size()}, {"slides", nlohmann::json::array()}};
  size_t done = 0, failed = 0, not_started = 0;
  for (const std::string& key : order) {
    const std::string status = slides[key]["status"];
    done += complete(status);
    not_started += status == "not started";
    failed += !complete(status) && status != "not started";
    cohort["slides"].push_back(std::move(slides[key]));
  }
  cohort.update({{"complete", done}, {"failed", failed}, {"not_started", not_started}});
  return cohort;
}

std::string format_run_reports(const RunReports& runs) {
  std::string out;
  for (size_t r = 0; r < runs.reports.size(); ++r) {
    const nlohmann::json& report = runs.reports[r];
    out += (r ? "\n" : "") + heading(report, runs.files[r]) + "\n";
    for (const std::string& line : details(report)) out += "  " + line + "\n";
    if (report.contains("error")) out += "  error: " + report["error"].get<std::string>() + "\n";
    std::vector<Cells> rows = {header(report)};
    for (const nlohmann::json& slide : report["slides"]) rows.push_back(slide_cells(report, slide));
    rows.push_back(total_cells(report));
    std::vector<bool> right(rows.front().size(), true);
    right[0] = right[1] = false;
    std::string table = format_columns(rows, right);
    for (size_t start = 0; start < table.size();) {  // indented as the lines above
      size_t end = table.find('\n', start) + 1;
      out += "  " + table.substr(start, end - start);
      start = end;
    }
    for (const nlohmann::json& slide : report["slides"])
      if (std::string reason = why(slide); !reason.empty())
        out += "  " + slide["slide"].get<std::string>() + ": " + slide["status"].get<std::string>() + ": " + reason +
               "\n";
  }
  const nlohmann::json cohort = cohort_of(runs);
  out += "\ncohort: " + cohort_line(cohort) + "\n";
  for (const nlohmann::json& slide : cohort["slides"]) {
    const std::string status = slide["status"];
    if (complete(status)) continue;
    out += "  " + slide["slide"].get<std::string>() + ": " + status +
           (status == "not started" ? "" : " in run " + slide["run"].get<std::string>()) +
           (slide.contains("error") ? ": " + slide["error"].get<std::string>() : "") + "\n";
  }
  for (const std::string& file : runs.unfinished)
    out += "unfinished report, not read (a run writing it now, or killed while it did): " + file + "\n";
  return out;
}

nlohmann::json run_reports_json(const RunReports& runs) {
  nlohmann::json out = {{"directory", runs.directory}, {"runs", nlohmann::json::array()}, {"unfinished", runs.unfinished}};
  for (size_t r = 0; r < runs.reports.size(); ++r)
    out["runs"].push_back({{"file", runs.files[r]}, {"report", runs.reports[r]}});
  out["cohort"] = cohort_of(runs);
  return out;
}

std::string run_reports_html(const RunReports& runs, const std::string& title) {
  auto row = [](const Cells& cells, const char* tag, const std::string& attributes = "") {
    std::string text = "<tr" + attributes + ">";
    for (const std::string& value : cells)
      text += std::string("<") + tag + ">" + html_escape(value) + "</" + tag + ">";
    return text + "</tr>\n";
  };
  const nlohmann::json cohort = cohort_of(runs);
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" +
                     html_escape(title) + "</title>\n<style>" + html_base_style +
                     "td:nth-child(-n+2), th:nth-child(-n+2), td:last-child, th:last-child { text-align: left; }\ntr.failed td, tr.skipped td { background: #fde8e4; }\n"
                     "</style></head>\n<body>\n<h1>" + html_escape(title) + "</h1>\n";
  page += "<h2>Cohort</h2>\n<p id=\"cohort-summary\">" + html_escape(cohort_line(cohort)) + "</p>\n";
  page += "<table id=\"cohort\"><thead>" + row({"slide", "status", "run", "tiles", "why"}, "th") + "</thead><tbody>\n";
  for (const nlohmann::json& slide : cohort["slides"]) {
    const std::string status = slide["status"];
    const std::string name = slide["slide"];
    page += row({name, status, slide.value("run", std::string("-")), cell(slide, "tiles"),
                 slide.value("error", std::string())},
                "td", " class=\"" + html_escape(status) + "\" data-slide=\"" + html_escape(name) + "\"");
  }
  page += "</tbody></table>\n";
  for (size_t r = 0; r < runs.reports.size(); ++r) {
    const nlohmann::json& report = runs.reports[r];
    const std::string name = run_name(runs.files[r]);
    page += "<h2 id=\"run-" + html_escape(name) + "\">" + html_escape(heading(report, runs.files[r])) + "</h2>\n<pre>";
    for (const std::string& line : details(report)) page += html_escape(line) + "\n";
    if (report.contains("error")) page += "error: " + html_escape(report["error"].get<std::string>()) + "\n";
    page += "</pre>\n<table class=\"run\" data-run=\"" + html_escape(name) + "\"><thead>";
    Cells columns = header(report);
    columns.push_back("why");
    page += row(columns, "th") + "</thead><tbody>\n";
    for (const nlohmann::json& slide : report["slides"]) {
      Cells cells = slide_cells(report, slide);
      cells.push_back(why(slide));
      page += row(cells, "td", " class=\"" + html_escape(cells[1]) + "\" data-slide=\"" + html_escape(cells[0]) + "\"");
    }
    Cells totals = total_cells(report);
    totals.push_back("");
    page += "</tbody><tfoot>" + row(totals, "td") + "</tfoot></table>\n";
  }
  for (const std::string& file : runs.unfinished)
    page += "<p class=\"unfinished\">unfinished report, not read: " + html_escape(file) + "</p>\n";
  return page + "</body></html>\n";
}

}  // namespace tessera::cli
