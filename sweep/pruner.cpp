#include "sweep/pruner.h"

#include <algorithm>
#include <optional>

#include "common/error.h"

namespace tessera::sweep {

namespace {

std::optional<double> value_at(const Trial& trial, int64_t step) {
  for (auto& [s, v] : trial.intermediate())
    if (s == step) return v;
  return std::nullopt;
}

class MedianPruner : public Pruner {
 public:
  MedianPruner(Direction direction, MedianOptions options) : direction_(direction), options_(options) {}

  bool should_prune(const Trial& trial, const std::vector<Trial>& trials) const override {
    if (trial.intermediate().empty()) return false;
    int64_t step = trial.intermediate().back().first;
    if (step < options_.warmup_steps) return false;
    int complete = 0;
    std::vector<double> others;
    for (auto& other : trials) {
      if (other.state != TrialState::complete || other.number == trial.number) continue;
      ++complete;
      if (auto v = value_at(other, step)) others.push_back(*v);
    }
    if (complete < options_.startup_trials || others.empty()) return false;
    std::sort(others.begin(), others.end());
    size_t half = others.size() / 2;
    double median = others.size() % 2 ? others[half] : 0.5 * (others[half - 1] + others[half]);
    double best = trial.intermediate().front().second;
    for (auto& [s, v] : trial.intermediate())
      if (better(direction_, v, best)) best = v;
    return better(direction_, median, best);
  }

 private:
  Direction direction_;
  MedianOptions options_;
};

class AshaPruner : public Pruner {
 public:
  AshaPruner(Direction direction, AshaOptions options) : direction_(direction), options_(options) {}

  bool should_prune(const Trial& trial, const std::vector<Trial>& trials) const override {
    auto& reported = trial.intermediate();
    if (reported.empty()) return false;
    int64_t step = reported.back().first;
    int64_t previous_step = reported.size() > 1 ? reported[reported.size() - 2].first : INT64_MIN;
    // Only the rungs this report reaches for the first time are decided now.
    for (int64_t rung = options_.min_resource; rung <= step; rung *= options_.reduction_factor) {
      if (rung <= previous_step) continue;
      double value = reported.back().second;
      std::vector<double> competing{value};
      for (auto& other : trials)
        if (other.number != trial.number)
          if (auto v = rung_value(other, rung)) competing.push_back(*v);
      std::sort(competing.begin(), competing.end(),
                [&](double a, double b) { return better(direction_, a, b); });
      size_t promoted = competing.size() / static_cast<size_t>(options_.reduction_factor);
      double threshold = competing[promoted == 0 ? 0 : promoted - 1];
      if (better(direction_, threshold, value)) return true;
    }
    return false;
  }

 private:
  // What a trial reported when it first reached the rung.
  static std::optional<double> rung_value(const Trial& trial, int64_t rung) {
    for (auto& [s, v] : trial.intermediate())
      if (s >= rung) return v;
    return std::nullopt;
  }

  Direction direction_;
  AshaOptions options_;
};

}  // namespace

std::unique_ptr<Pruner> make_pruner(std::string_view name, Direction direction, MedianOptions median,
                                    AshaOptions asha) {
  if (name == "none") return nullptr;
  if (name == "median") return std::make_unique<MedianPruner>(direction, median);
  if (name == "asha") return std::make_unique<AshaPruner>(direction, asha);
  throw UsageError("--pruner: '" + std::string(name) + "' is not none, median or asha");
}

}  // namespace tessera::sweep
