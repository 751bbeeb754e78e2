#include "sweep/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "common/csv.h"
#include "common/html.h"
#include "common/progress.h"
#include "sweep/train_flags.h"

namespace tessera::sweep {

namespace {

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

std::string value_column(const Trial& trial) {
  if (trial.value) return number_text(*trial.value);
  // A pruned trial shows where it stood when it was stopped.
  if (trial.state == TrialState::pruned && !trial.intermediate().empty())
    return "(" + number_text(trial.intermediate().back().second) + ")";
  return "-";
}

}  // namespace

double trial_seconds(const Trial& trial) {
  double total = 0;
  for (auto& attempt : trial.attempts)
    if (attempt.finished > 0) total += attempt.finished - attempt.started;
  return total;
}

// An --oom-retry changes --batch and --accumulate; environment variables come first.
std::string best_flags(const Trial& best, const StudyConfig& config) {
  std::string environment;
  std::vector<std::string> flags;
  for (auto& param : config.space) {
    auto text = value_text(best.params[param.name]);
    if (param.is_environment()) environment += param.target() + "=" + text + " ";
    else set_flag(flags, param.target(), text);
  }
  auto& last = best.attempts.back();
  if (last.index > 0 && last.batch) set_flag(flags, "--batch", std::to_string(last.batch));
  if (last.index > 0 && last.accumulate) set_flag(flags, "--accumulate", std::to_string(last.accumulate));
  std::string out = environment;
  for (auto& token : flags) out += token + " ";
  if (!out.empty()) out.pop_back();
  return out;
}

std::optional<std::string> best_checkpoint(const Trial& trial) {
  if (trial.attempts.empty()) return std::nullopt;
  return flag_value(trial.attempts.back().command, "--checkpoint");
}

namespace {

// A linear or logarithmic axis from data values to pixels.
struct Axis {
  double low, high;
  bool log = false;
  double from, to;  // pixels

  double map(double value) const {
    double a = log ? std::log10(low) : low, b = log ? std::log10(high) : high, v = log ? std::log10(value) : value;
    return b == a ? 0.5 * (from + to) : from + (v - a) / (b - a) * (to - from);
  }
  // Round values to label: powers of ten on a log axis, steps of 1, 2 or 5 x 10^k otherwise.
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      for (double p = std::floor(std::log10(low)); p <= std::ceil(std::log10(high)); ++p)
        if (double v = std::pow(10.0, p); v >= low * 0.999 && v <= high * 1.001) out.push_back(v);
      return out;
    }
    double span = high - low, raw = span / 5, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
    double step = magnitude * (raw / magnitude < 2 ? 2 : raw / magnitude < 5 ? 5 : 10);
    for (double v = std::ceil(low / step) * step; v <= high + step * 1e-9; v += step) out.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }
};

Axis data_axis(std::vector<double> values, bool log, double from, double to) {
  auto [low, high] = std::minmax_element(values.begin(), values.end());
  Axis axis{*low, *high, log, from, to};
  if (log) {
    axis.low /= 1.2;
    axis.high *= 1.2;
  } else {
    double pad = axis.high > axis.low ? 0.05 * (axis.high - axis.low) : std::max(1.0, std::abs(axis.low) * 0.1);
    axis.low -= pad;
    axis.high += pad;
  }
  return axis;
}

class Svg {
 public:
  void line(double x1, double y1, double x2, double y2, const char* style) {
    out_ << "<line x1='" << x1 << "' y1='" << y1 << "' x2='" << x2 << "' y2='" << y2 << "' style='" << style << "'/>\n";
  }
  void text(double x, double y, const std::string& label, const char* anchor = "middle", int size = 11) {
    out_ << "<text x='" << x << "' y='" << y << "' font-size='" << size << "' text-anchor='" << anchor << "'>"
         << html_escape(label) << "</text>\n";
  }
  void circle(double x, double y, const char* fill, const std::string& title) {
    out_ << "<circle cx='" << x << "' cy='" << y << "' r='3.5' fill='" << fill << "'><title>" << html_escape(title)
         << "</title></circle>\n";
  }
  void polyline(const std::vector<std::pair<double, double>>& points, const char* style) {
    out_ << "<polyline fill='none' style='" << style << "' points='";
    for (auto& [x, y] : points) out_ << x << "," << y << " ";
    out_ << "'/>\n";
  }
  // A framed plot area with ticks on both axes; `x_labels` replaces numeric x ticks (choices).
  void frame(const Axis& x, const Axis& y, const std::string& title, const std::string& x_title,
             const std::vector<std::string>& x_labels = {}) {
    double left = x.from, right = x.to, bottom = y.from, top = y.to;
    out_ << "<rect x='" << left << "' y='" << top << "' width='" << right - left << "' height='" << bottom - top
         << "' fill='white' stroke='#888'/>\n";
    text(0.5 * (left + right), top - 8, title, "middle", 13);
    text(0.5 * (left + right), bottom + 32, x_title);
    if (x_labels.empty())
      for (double t : x.ticks()) {
        line(x.map(t), bottom, x.map(t), bottom + 4, "stroke:#888");
        text(x.map(t), bottom + 16, number_text(t));
      }
    else
      for (size_t i = 0; i < x_labels.size(); ++i) text(x.map(static_cast<double>(i)), bottom + 16, x_labels[i]);
    for (double t : y.ticks()) {
      line(left - 4, y.map(t), right, y.map(t), "stroke:#eee");
      text(left - 6, y.map(t) + 4, number_text(t), "end");
    }
  }
  std::string str(double width, double height) const {
    std::ostringstream svg;
    svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
        << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='#fafafa'/>\n"
        << out_.str() << "</svg>\n";
    return svg.str();
  }

 private:
  std::ostringstream out_;
};

}  // namespace

const Trial* best_trial(const std::vector<Trial>& trials, Direction direction) {
  const Trial* best = nullptr;
  for (auto& trial : trials)
    if (trial.state == TrialState::complete && trial.value && std::isfinite(*trial.value) &&
        (!best || better(direction, *trial.value, *best->value)))
      best = &trial;
  return best;
}

std::string format_summary(const std::vector<Trial>& trials, Direction direction) {
  std::map<std::string, int> counts;
  for (auto& trial : trials) ++counts[std::string(to_string(trial.state))];
  std::string out = std::to_string(trials.size()) + " trials:";
  for (auto& [state, count] : counts) out += " " + std::to_string(count) + " " + state;
  out += "\n";
  if (auto* best = best_trial(trials, direction))
    out += "best: trial " + std::to_string(best->number) + ", value " + number_text(*best->value) + ", " +
           best->params.dump() + "\n";
  return out;
}

nlohmann::json summary_json(const std::vector<Trial>& trials, Direction direction) {
  nlohmann::json states = nlohmann::json::object();
  for (auto& trial : trials) states[std::string(to_string(trial.state))] = states.value(to_string(trial.state), 0) + 1;
  nlohmann::json out = {{"event", "sweep"}, {"trials", trials.size()}, {"states", states}};
  if (auto* best = best_trial(trials, direction))
    out["best"] = {{"number", best->number}, {"value", *best->value}, {"params", best->params}};
  return out;
}

std::string trial_line(const nlohmann::json& event) {
  std::string line = "trial " + std::to_string(event.value("trial", -1)) + "  " + event.value("state", std::string());
  if (event.value("attempt", 0) > 0) line += " (attempt " + std::to_string(event["attempt"].get<int>() + 1) + ")";
  if (event.contains("value")) line += "  value " + number_text(event["value"].get<double>());
  if (event.contains("exit_code") && event["exit_code"] != 0) line += "  exit " + event["exit_code"].dump();
  if (event.contains("signal")) line += "  signal " + event["signal"].dump();
  line += "  " + std::to_string(std::lround(event.value("seconds", 0.0))) + "s";
  if (event.contains("retry_batch")) line += "  (again with batch " + event["retry_batch"].dump() + ")";
  return line;
}

std::string format_table(const std::vector<Trial>& trials, const StudyConfig& config) {
  std::vector<std::string> header = {"trial", "state", "value", "attempts", "seconds"};
  for (auto& param : config.space) header.push_back(param.name);
  header.insert(header.end(), {"device", "peak device"});
  std::vector<std::vector<std::string>> rows;
  for (auto& trial : trials) {
    // A running trial shows when its worker last beat: a dead worker's trial shows its age.
    auto state = std::string(to_string(trial.state));
    if (trial.heartbeat_age) state += " (beat " + std::to_string(std::lround(*trial.heartbeat_age)) + " s ago)";
    std::vector<std::string> row = {std::to_string(trial.number), state,
                                    value_column(trial), std::to_string(trial.attempts.size()),
                                    number_text(trial_seconds(trial))};
    for (auto& param : config.space) {
      const auto& value = trial.params.contains(param.name) ? trial.params[param.name] : nlohmann::json();
      row.push_back(value.is_number_float() ? number_text(value.get<double>()) : value.is_null() ? "-" : value_text(value));
    }
    const Attempt* last = trial.attempts.empty() ? nullptr : &trial.attempts.back();
    row.push_back(last && !last->device.empty() ? last->device
                  : last && last->device_index >= 0 ? std::to_string(last->device_index)
                                                    : "-");
    row.push_back(last && last->peak_device_bytes ? std::to_string(*last->peak_device_bytes) : "-");
    rows.push_back(row);
  }
  std::vector<TableColumn> columns;
  for (auto& title : header) columns.push_back({title});
  std::string out = aligned_table(columns, rows);
  out += format_summary(trials, config.direction);
  if (auto* best = best_trial(trials, config.direction)) {
    out += "best flags: " + best_flags(*best, config) + "\n";
    if (auto checkpoint = best_checkpoint(*best)) out += "best checkpoint: " + *checkpoint + "\n";
  }
  return out;
}

std::string export_csv(const std::vector<Trial>& trials, const StudyConfig& config) {
  std::string out = "number,state,value,attempts,seconds,batch,accumulate,device,peak_device_bytes,exit_code,signal";
  for (auto& param : config.space) out += "," + csv_field(param.name);
  out += "\n";
  for (auto& trial : trials) {
    const Attempt* last = trial.attempts.empty() ? nullptr : &trial.attempts.back();
    auto optional_text = [](auto value) { return value ? std::to_string(*value) : std::string(); };
    out += std::to_string(trial.number) + "," + std::string(to_string(trial.state)) + "," +
           (trial.value ? number_text(*trial.value) : "") + "," + std::to_string(trial.attempts.size()) + "," +
           number_text(trial_seconds(trial)) + "," + (last && last->batch ? std::to_string(last->batch) : "") + "," +
           (last && last->accumulate ? std::to_string(last->accumulate) : "") + "," +
           csv_field(last ? last->device : "") + "," + (last ? optional_text(last->peak_device_bytes) : "") + "," +
           (last ? optional_text(last->exit_code) : "") + "," + (last ? optional_text(last->signal) : "");
    for (auto& param : config.space)
      out += "," + (trial.params.contains(param.name) ? csv_field(value_text(trial.params[param.name])) : "");
    out += "\n";
  }
  return out;
}

nlohmann::json study_json(const std::vector<Trial>& trials, const StudyConfig& config) {
  nlohmann::json out = {{"direction", to_string(config.direction)}, {"objective", config.objective}, {"sampler", config.sampler},
                        {"pruner", config.pruner}, {"seed", config.seed}, {"trials_wanted", config.target_trials},
                        {"space", to_json(config.space)}, {"train_flags", config.train_flags},
                        {"trials", nlohmann::json::array()}};
  for (auto& trial : trials) {
    nlohmann::json attempts = nlohmann::json::array();
    for (auto& a : trial.attempts) {
      nlohmann::json intermediate = nlohmann::json::array();
      for (auto& [step, value] : a.intermediate) intermediate.push_back({{"step", step}, {"value", value}});
      attempts.push_back({{"attempt", a.index}, {"state", to_string(a.state)}, {"command", a.command},
                          {"batch", a.batch}, {"accumulate", a.accumulate}, {"device_index", a.device_index},
                          {"device", a.device}, {"exit_code", a.exit_code ? nlohmann::json(*a.exit_code) : nullptr},
                          {"signal", a.signal ? nlohmann::json(*a.signal) : nullptr}, {"stderr_tail", a.stderr_tail},
                          {"peak_device_bytes", a.peak_device_bytes ? nlohmann::json(*a.peak_device_bytes) : nullptr},
                          {"value", a.value ? nlohmann::json(*a.value) : nullptr}, {"metrics", a.metrics},
                          {"intermediate", intermediate}, {"sweep_rss_bytes", a.sweep_rss_bytes}, {"worker", a.worker},
                          {"started", a.started}, {"finished", a.finished}});
    }
    out["trials"].push_back({{"number", trial.number}, {"state", to_string(trial.state)},
                             {"value", trial.value ? nlohmann::json(*trial.value) : nullptr},
                             {"params", trial.params}, {"sampler_saw", trial.sampler_saw}, {"attempts", attempts}});
  }
  if (auto* best = best_trial(trials, config.direction)) {
    out["best"] = {{"number", best->number}, {"value", *best->value}, {"params", best->params}};
    if (auto checkpoint = best_checkpoint(*best)) out["best"]["checkpoint"] = *checkpoint;
  }
  return out;
}

std::string export_json(const std::vector<Trial>& trials, const StudyConfig& config) {
  return study_json(trials, config).dump(2) + "\n";
}

std::string export_svg(const std::vector<Trial>& trials, const StudyConfig& config) {
  const double width = 960, history_height = 320, panel_width = 480, panel_height = 300;
  std::vector<const Trial*> scored;
  for (auto& trial : trials)
    if (trial.value && std::isfinite(*trial.value)) scored.push_back(&trial);
  size_t panels = config.space.size();
  double height = history_height + static_cast<double>((panels + 1) / 2) * panel_height + 20;
  Svg svg;
  if (scored.empty()) {
    svg.text(width / 2, 60, "no complete trial yet", "middle", 14);
    return svg.str(width, 120);
  }
  std::vector<double> values, numbers;
  for (auto* trial : scored) {
    values.push_back(*trial->value);
    numbers.push_back(trial->number);
  }
  numbers.push_back(0);
  numbers.push_back(static_cast<double>(trials.size() - 1));
  Axis x = data_axis(numbers, false, 80, width - 30), y = data_axis(values, false, history_height - 50, 40);
  svg.frame(x, y, "optimisation history (" + std::string(to_string(config.direction)) + ")", "trial");
  std::vector<std::pair<double, double>> best_line;
  std::optional<double> best;
  for (auto* trial : scored) {
    svg.circle(x.map(trial->number), y.map(*trial->value), "#3b6ea8",
               "trial " + std::to_string(trial->number) + ": " + number_text(*trial->value));
    if (!best || better(config.direction, *trial->value, *best)) {
      if (best) best_line.push_back({x.map(trial->number), y.map(*best)});
      best = trial->value;
      best_line.push_back({x.map(trial->number), y.map(*best)});
    }
  }
  best_line.push_back({x.to, y.map(*best)});
  svg.polyline(best_line, "stroke:#d0452f;stroke-width:2");
  svg.text(x.to - 4, y.to + 14, "best so far", "end");

  for (size_t p = 0; p < panels; ++p) {
    auto& param = config.space[p];
    double left = (p % 2) * panel_width, top = history_height + static_cast<double>(p / 2) * panel_height;
    bool is_choice = param.distribution == Distribution::choice;
    bool is_log = param.distribution == Distribution::log_uniform || param.distribution == Distribution::log_integer;
    std::vector<double> positions;
    for (auto* trial : scored)
      positions.push_back(is_choice ? to_internal(param, trial->params[param.name]) : trial->params[param.name].get<double>());
    Axis px = is_choice ? Axis{-0.5, static_cast<double>(param.choices.size()) - 0.5, false, left + 80, left + panel_width - 30}
                        : data_axis(positions, is_log, left + 80, left + panel_width - 30);
    Axis py = data_axis(values, false, top + panel_height - 50, top + 40);
    std::vector<std::string> labels;
    for (auto& choice : param.choices) labels.push_back(value_text(choice));
    svg.frame(px, py, param.name + " against the objective", param.name + (is_log ? " (log)" : ""), labels);
    for (size_t i = 0; i < scored.size(); ++i)
      svg.circle(px.map(positions[i]), py.map(values[i]), "#3b6ea8",
                 "trial " + std::to_string(scored[i]->number) + ": " + number_text(values[i]));
  }
  return svg.str(width, height);
}

}  // namespace tessera::sweep
