#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera {

using Clock = std::chrono::steady_clock;

namespace {

bool json_lines = false;  // --json

std::string text_of(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number()) return format_number(value);
  return value.dump();
}

// "key value, key value" for the fields of `record` other than `skip`.
std::string fields_text(const nlohmann::json& record, std::initializer_list<const char*> skip) {
  std::string text;
  for (auto& [key, value] : record.items()) {
    if (std::find_if(skip.begin(), skip.end(), [&](const char* s) { return key == s; }) != skip.end()) continue;
    text += (text.empty() ? "" : ", ") + key + " " + text_of(value);
  }
  return text;
}

// "split: training 3 slides, 140 patches (70, 70); validation 1 slide, 60 patches (30, 30); held
// out: s4". Warnings come on lines of their own.
std::string split_line(const nlohmann::json& r) {
  std::string line = "split:";
  for (const char* side : {"train", "validation"}) {
    if (!r.contains(side)) continue;
    const nlohmann::json& counts = r[side];
    line += std::string(line.back() == ':' ? " " : "; ") + (side == std::string("train") ? "training" : side);
    for (const char* unit : {"slides", "groups", "patches"})
      if (counts.contains(unit)) line += " " + format_number(counts[unit]) + " " + unit + ",";
    line.pop_back();
    if (counts.contains("per_class")) {
      std::string per_class;
      for (auto& n : counts["per_class"]) per_class += (per_class.empty() ? "" : ", ") + format_number(n);
      line += " (per class " + per_class + ")";
    }
  }
  if (r.contains("held_out_slides")) {
    const auto& slides = r["held_out_slides"];
    std::string names;
    for (size_t i = 0; i < slides.size() && i < 4; ++i) names += (i ? ", " : "") + text_of(slides[i]);
    if (slides.size() > 4) names += " and " + std::to_string(slides.size() - 4) + " more";
    line += "; held out: " + names;
  }
  return line;
}

std::string epoch_line(const nlohmann::json& r, double seconds_left) {
  auto number = [&](const char* key) { return r.contains(key) && r[key].is_number(); };
  auto metric = [&](const char* key) {  // fixed decimals, so that the lines of a run align
    if (!number(key)) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof text, "%.4f", r[key].get<double>());
    return std::string(text);
  };
  std::string line = "epoch " + text_of(r["epoch"]);
  if (number("epochs")) line += "/" + text_of(r["epochs"]);
  line += "  loss " + metric("train_loss") + "  accuracy " + metric("train_accuracy");
  if (number("val_loss")) {
    line += "  |  val loss " + metric("val_loss") + "  accuracy " + metric("val_accuracy");
    if (number("val_auc")) line += "  AUC " + metric("val_auc");
  }
  if (number("images_per_second"))
    line += "  |  " + std::to_string(std::llround(r["images_per_second"].get<double>())) + " images/s";
  if (number("skipped_steps") && r["skipped_steps"].get<double>() > 0)
    line += "  " + text_of(r["skipped_steps"]) + " steps skipped (fp16 overflow)";
  if (seconds_left >= 0) line += "  " + format_duration(seconds_left) + " left";
  return line;
}

}  // namespace

Progress::Progress(std::string task, uint64_t total, std::string label)
    : task_(std::move(task)), label_(label.empty() ? task_ : std::move(label)), total_(total), human_(human()),
      start_(Clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::set_json(bool json) { json_lines = json; }

bool Progress::json() { return json_lines; }

bool Progress::human() { return human(STDERR_FILENO); }

bool Progress::human(int fd) { return !json_lines && isatty(fd) == 1; }

void Progress::update(uint64_t done, const nlohmann::json& fields) {
  done_ = done;
  if (!fields.is_null()) fields_ = fields;
  draw(false);
}

void Progress::event(const nlohmann::json& record) {
  event(record, human_ ? render_record(task_, record, seconds_left()) : std::string());
}

void Progress::event(const nlohmann::json& record, const std::string& readable) {
  if (!human_) {
    if (record.is_null()) return;
    nlohmann::json line = {{"task", task_}};
    line.update(record);
    std::fprintf(stderr, "%s\n", line.dump().c_str());
    return;
  }
  std::fprintf(stderr, "\r\033[K%s\n", readable.c_str());
  mark_done_ = done_;
  mark_time_ = Clock::now();
  if (!finished_) draw(true);
}

void Progress::finish() {
  if (finished_) return;
  draw(true);
  if (human_) std::fputc('\n', stderr);
  finished_ = true;
}

void Progress::finish(const nlohmann::json& record, const std::string& line) {
  if (finished_) return;
  if (human_) {
    finished_ = true;
    std::fprintf(stderr, "\r\033[K%s\n", line.c_str());
    return;
  }
  finish();
  event(record, line);
}

double Progress::seconds_left() const {
  if (!total_ || !done_ || done_ >= total_) return -1;
  // The pace since the last event (an epoch's end) once there was one: start-up work (compiling
  // pipelines, filling the loader's queue) is not repeated.
  bool marked = mark_done_ > 0 && done_ > mark_done_;
  uint64_t from = marked ? mark_done_ : 0;
  double elapsed = std::chrono::duration<double>(Clock::now() - (marked ? mark_time_ : start_)).count();
  return elapsed * static_cast<double>(total_ - std::min(done_, total_)) / static_cast<double>(done_ - from);
}

void Progress::draw(bool force) {
  auto now = Clock::now();
  auto interval = human_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(2000);
  if (!force && now - last_draw_ < interval) return;
  last_draw_ = now;
  double seconds = std::chrono::duration<double>(now - start_).count();
  if (!human_) {
    nlohmann::json line = {{"task", task_}, {"done", done_}, {"elapsed_s", seconds}};
    if (total_) line["total"] = total_;
    if (fields_.is_object()) line.update(fields_);
    std::fprintf(stderr, "%s\n", line.dump().c_str());
    return;
  }
  std::string bar;
  if (total_) {
    const int width = 30;
    int filled = static_cast<int>(width * static_cast<double>(std::min(done_, total_)) / static_cast<double>(total_));
    bar = "[" + std::string(static_cast<size_t>(filled), '#') +
          std::string(static_cast<size_t>(width - filled), ' ') + "] ";
  }
  std::string extra;
  if (fields_.is_object())
    for (auto& [key, value] : fields_.items()) extra += "  " + key + " " + text_of(value);
  std::string count = std::to_string(done_) + (total_ ? "/" + std::to_string(total_) : "");
  std::string left = seconds_left() >= 0 && done_ < total_ ? "  " + format_duration(seconds_left()) + " left" : "";
  std::fprintf(stderr, "\r\033[K%s %s%s%s  %s%s", label_.c_str(), bar.c_str(), count.c_str(), extra.c_str(),
               format_duration(seconds).c_str(), left.c_str());
  std::fflush(stderr);
}

void report(const std::string& task, const nlohmann::json& record) {
  report(task, record, Progress::human() ? render_record(task, record) : std::string());
}

void report(const std::string& task, const nlohmann::json& record, const std::string& readable) {
  if (Progress::human()) {
    std::fprintf(stderr, "%s\n", readable.c_str());
    return;
  }
  if (record.is_null()) return;
  nlohmann::json line = {{"task", task}};
  line.update(record);
  std::fprintf(stderr, "%s\n", line.dump().c_str());
}

std::string render_record(const std::string& task, const nlohmann::json& record, double seconds_left) {
  if (!record.is_object()) return task + ": " + text_of(record);
  std::string event = record.value("event", std::string());
  if (event == "epoch" && record.contains("epoch")) return epoch_line(record, seconds_left);
  if (event == "split") return split_line(record);
  if (event == "checkpoint" && record.contains("path")) {
    std::string line = "checkpoint: " + text_of(record["path"]);
    if (record.contains("epoch")) line += " (epoch " + text_of(record["epoch"]) + ")";
    return line;
  }
  for (const char* kind : {"error", "warning"})
    if (record.contains(kind)) {
      std::string rest = fields_text(record, {kind, "event"});
      return task + " " + kind + ": " + text_of(record[kind]) + (rest.empty() ? "" : " (" + rest + ")");
    }
  return task + ": " + fields_text(record, {"event"});
}

std::string format_number(const nlohmann::json& value) {
  if (value.is_number_integer() || value.is_number_unsigned()) return value.dump();
  if (!value.is_number()) return text_of(value);
  double number = value.get<double>();
  char text[32];
  if (std::isfinite(number) && number == std::round(number) && std::fabs(number) < 1e15)
    std::snprintf(text, sizeof text, "%.0f", number);
  else
    std::snprintf(text, sizeof text, "%.4g", number);
  return text;
}

std::string format_duration(double seconds, bool tenths) {
  auto whole = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char text[32];
  if (tenths && seconds < 9.95)
    std::snprintf(text, sizeof text, seconds < 0.995 ? "%.2fs" : "%.1fs", std::max(0.0, seconds));
  else if (whole < 60)
    std::snprintf(text, sizeof text, "%llds", whole);
  else if (whole < 3600)
    std::snprintf(text, sizeof text, "%lldm%02llds", whole / 60, whole % 60);
  else
    std::snprintf(text, sizeof text, "%lldh%02lldm", whole / 3600, whole / 60 % 60);
  return text;
}

std::string aligned_table(const std::vector<TableColumn>& columns, const std::vector<std::vector<std::string>>& rows,
                          bool total) {
  std::vector<size_t> widths(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) {
    widths[c] = columns[c].title.size();
    for (auto& row : rows) widths[c] = std::max(widths[c], c < row.size() ? row[c].size() : 0);
  }
  std::string out;
  auto add_row = [&](auto cell_of) {
    std::string line;
    for (size_t c = 0; c < columns.size(); ++c) {
      std::string cell = cell_of(c), pad(widths[c] - std::min(widths[c], cell.size()), ' ');
      line += (c ? "  " : "") + (columns[c].right ? pad + cell : cell + pad);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  add_row([&](size_t c) { return columns[c].title; });
  for (size_t r = 0; r < rows.size(); ++r) {
    if (total && r + 1 == rows.size()) {
      size_t width = 2 * (columns.size() - 1);
      for (size_t w : widths) width += w;
      out += std::string(width, '-') + "\n";
    }
    add_row([&](size_t c) { return c < rows[r].size() ? rows[r][c] : std::string(); });
  }
  return out;
}

}  // namespace tessera
