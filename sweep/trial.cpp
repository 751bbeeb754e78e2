#include "sweep/trial.h"

#include <array>

#include "common/error.h"

namespace tessera::sweep {

namespace {
constexpr std::array<std::pair<TrialState, std::string_view>, 9> state_names{{
    {TrialState::running, "running"},
    {TrialState::complete, "complete"},
    {TrialState::pruned, "pruned"},
    {TrialState::oom, "oom"},
    {TrialState::diverged, "diverged"},
    {TrialState::crashed, "crashed"},
    {TrialState::timeout, "timeout"},
    {TrialState::failed, "failed"},
    {TrialState::interrupted, "interrupted"},
}};
}  // namespace

std::string_view to_string(TrialState state) {
  for (auto [value, name] : state_names)
    if (value == state) return name;
  return "unknown";
}

TrialState trial_state_from(std::string_view name) {
  for (auto [value, known] : state_names)
    if (known == name) return value;
  throw BadInput("unknown trial state '" + std::string(name) + "' in the study");
}

bool is_finished(TrialState state) { return state != TrialState::running && state != TrialState::interrupted; }

std::string_view to_string(Direction direction) {
  return direction == Direction::minimize ? "minimize" : "maximize";
}

Direction direction_from(std::string_view name) {
  if (name == "minimize") return Direction::minimize;
  if (name == "maximize") return Direction::maximize;
  throw UsageError("--direction: '" + std::string(name) + "' is neither minimize nor maximize");
}

std::optional<Direction> direction_of_metric(std::string_view metric) {
  for (std::string_view lower : {"loss", "error"})
    if (metric.find(lower) != std::string_view::npos) return Direction::minimize;
  for (std::string_view higher : {"accuracy", "auc", "f1", "precision", "recall", "dice", "iou", "per_second"})
    if (metric.find(higher) != std::string_view::npos) return Direction::maximize;
  return std::nullopt;
}

bool better(Direction direction, double a, double b) { return direction == Direction::minimize ? a < b : a > b; }

const std::vector<std::pair<int64_t, double>>& Trial::intermediate() const {
  static const std::vector<std::pair<int64_t, double>> none;
  return attempts.empty() ? none : attempts.back().intermediate;
}

}  // namespace tessera::sweep
