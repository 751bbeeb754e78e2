#include "sweep/pruner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <unordered_map>

#include "common/error.h"

namespace tessera::sweep {

namespace {

class MedianPruner : public Pruner {
 public:
  MedianPruner(Direction direction, MedianOptions options) : direction_(direction), options_(options) {}

  // Asked on every report line: the trial's best so far and the others' values by step are
  // kept up to date as lines come, so that a long report costs no more per line than a short one.
  bool should_prune(const Trial& trial, const std::vector<Trial>& trials) const override {
    if (trial.intermediate().empty()) return false;
    int64_t step = trial.intermediate().back().first;
    if (step < options_.warmup_steps) return false;
    int complete = 0;
    std::vector<double> others;
    for (auto& other : trials) {
      if (other.state != TrialState::complete || other.number == trial.number) continue;
      ++complete;
      auto& values = view(other).first_at;
      if (auto found = values.find(step); found != values.end()) others.push_back(found->second);
    }
    if (complete < options_.startup_trials || others.empty()) return false;
    std::sort(others.begin(), others.end());
    size_t half = others.size() / 2;
    double median = others.size() % 2 ? others[half] : 0.5 * (others[half - 1] + others[half]);
    return better(direction_, median, view(trial).best);
  }

 private:
  // What the pruner knows of a trial's latest attempt: the first value at each step, its best
  // value, how many values it has taken in and the last of them (values are appended; any other
  // change starts the view again).
  struct View {
    size_t attempts = 0, taken = 0;
    std::unordered_map<int64_t, double> first_at;
    double best = 0;
    std::pair<int64_t, double> last;
  };

  static bool same(std::pair<int64_t, double> a, std::pair<int64_t, double> b) {
    return a.first == b.first && (a.second == b.second || (std::isnan(a.second) && std::isnan(b.second)));
  }

  const View& view(const Trial& trial) const {
    View& known = views_[trial.number];
    const auto& values = trial.intermediate();
    bool appended = known.attempts == trial.attempts.size() && known.taken <= values.size() &&
                    (known.taken == 0 || same(values[known.taken - 1], known.last));
    if (!appended) known = {trial.attempts.size()};
    for (; known.taken < values.size(); ++known.taken) {
      known.last = values[known.taken];
      auto [step, value] = values[known.taken];
      known.first_at.emplace(step, value);
      if (known.taken == 0 || better(direction_, value, known.best)) known.best = value;
    }
    return known;
  }

  Direction direction_;
  MedianOptions options_;
  mutable std::map<int, View> views_;  // by trial number
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
