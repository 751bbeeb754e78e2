#include "tools/run_report_view.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "common/html.h"
#include "common/progress.h"
#include "common/run_report.h"

namespace tessera::cli {

namespace {

using Cells = std::vector<std::string>;

// A run's name: its report's file name without .json (its start time).
std::string run_name(const std::string& file) { return std::filesystem::path(file).stem().string(); }

std::string cell(const nlohmann::json& object, const char* key) {
  return object.contains(key) ? format_number(object[key]) : "-";
}

std::string percent(const nlohmann::json& object, const char* key) {
  if (!object.contains(key) || !object[key].is_number()) return "-";
  return std::to_string(std::lround(object[key].get<double>() * 100)) + "%";
}

bool has_device(const nlohmann::json& report) { return report["command"] == "extract"; }

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

// Why a slide failed or was interrupted, or what its run warned of.
std::string why(const nlohmann::json& slide) {
  if (slide.contains("error")) return slide["error"].get<std::string>();
  if (slide.contains("warning") && slide["warning"].is_string()) return "warning: " + slide["warning"].get<std::string>();
  return "";
}

std::string heading(const nlohmann::json& report, const std::string& file) {
  std::string text = report["command"].get<std::string>() + " run " + run_name(file) + ": " +
                     report["outcome"].get<std::string>();
  if (report["outcome"] == "interrupted")
    text += " (killed, or still running: pid " + cell(report, "pid") + " on " + report.value("host", std::string("?")) +
            "; last written " + report["ended"].get<std::string>() + ")";
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

}  // namespace

std::string format_run_report(const nlohmann::json& report, const std::string& file) {
  std::string out = heading(report, file) + "\n";
  for (const std::string& line : details(report)) out += "  " + line + "\n";
  if (report.contains("error")) out += "  error: " + report["error"].get<std::string>() + "\n";
  std::vector<TableColumn> columns;
  for (const std::string& title : header(report)) columns.push_back({title, columns.size() >= 2});  // numbers right
  std::vector<Cells> rows;
  for (const nlohmann::json& slide : report["slides"]) rows.push_back(slide_cells(report, slide));
  rows.push_back(total_cells(report));
  const std::string table = aligned_table(columns, rows, true);
  for (size_t start = 0; start < table.size();) {  // indented as the lines above
    const size_t end = table.find('\n', start) + 1;
    out += "  " + table.substr(start, end - start);
    start = end;
  }
  for (const nlohmann::json& slide : report["slides"])
    if (std::string reason = why(slide); !reason.empty())
      out += "  " + slide["slide"].get<std::string>() + ": " + slide["status"].get<std::string>() + ": " + reason + "\n";
  return out;
}

std::string run_report_html(const nlohmann::json& report, const std::string& file) {
  auto row = [](const Cells& cells, const char* tag, const std::string& attributes = "") {
    std::string text = "<tr" + attributes + ">";
    for (const std::string& value : cells) text += std::string("<") + tag + ">" + html_escape(value) + "</" + tag + ">";
    return text + "</tr>\n";
  };
  const std::string title = heading(report, file);
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" + html_escape(title) +
                     "</title>\n<style>" + html_base_style +
                     "td:nth-child(-n+2), th:nth-child(-n+2), td:last-child, th:last-child { text-align: left; }\n"
                     "tr.failed td, tr.interrupted td { background: #fde8e4; }\n</style></head>\n<body>\n<h1>" +
                     html_escape(title) + "</h1>\n<pre>";
  for (const std::string& line : details(report)) page += html_escape(line) + "\n";
  if (report.contains("error")) page += "error: " + html_escape(report["error"].get<std::string>()) + "\n";
  page += "</pre>\n<table id=\"slides\"><thead>";
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
  return page + "</tbody><tfoot>" + row(totals, "td") + "</tfoot></table>\n</body></html>\n";
}

}  // namespace tessera::cli
