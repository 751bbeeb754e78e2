// Trials and their attempts as the sweep, the samplers, the pruners and the study store see them.
#pragma once
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::sweep {

// docs/architecture.md, "Formats", Study: the states a trial or one of its attempts ends in; `interrupted`
// marks an attempt that was running when its sweep was stopped, died, or stopped beating (its
// trial is run again).
enum class TrialState { running, complete, pruned, oom, diverged, crashed, timeout, failed, interrupted };

std::string_view to_string(TrialState state);
// Throws BadInput for a name that is not a state (a damaged study file).
TrialState trial_state_from(std::string_view name);
bool is_finished(TrialState state);
inline std::ostream& operator<<(std::ostream& out, TrialState state) { return out << to_string(state); }

enum class Direction { minimize, maximize };
std::string_view to_string(Direction direction);
// Throws UsageError naming --direction.
Direction direction_from(std::string_view name);
// The direction a metric of train's report is optimised in: losses and errors down, accuracy,
// AUC and the like up; nullopt for a name that says neither (--direction must).
std::optional<Direction> direction_of_metric(std::string_view metric);
// True when `a` is a better objective value than `b`.
bool better(Direction direction, double a, double b);

// One run of `tessera train` for a trial: the first, an --oom-retry with a smaller
// micro-batch, or a re-run after the sweep was killed.
struct Attempt {
  int index = 0;
  TrialState state = TrialState::running;
  std::vector<std::string> command;  // the full command line of the child
  // 0: neither on the command line nor, for a batch train chose from its plan, reported by train
  int64_t batch = 0, accumulate = 0;
  int device_index = -1;              // -1: train chose
  std::string device;                 // the device name the child reported
  std::optional<int> exit_code, signal;
  std::string stderr_tail;
  std::optional<uint64_t> peak_device_bytes;
  std::optional<double> value;
  nlohmann::json metrics;
  std::vector<std::pair<int64_t, double>> intermediate;  // (step, value) in the order reported
  uint64_t sweep_rss_bytes = 0;  // the sweep's own resident memory when the attempt ended
  std::string worker;            // the sweep that ran it: host/pid/start
  double started = 0, finished = 0;  // seconds since the epoch
};

struct Trial {
  int number = 0;
  TrialState state = TrialState::running;
  nlohmann::json params = nlohmann::json::object();  // parameter name -> value
  std::optional<double> value;
  std::vector<Attempt> attempts;
  std::vector<int> sampler_saw;  // the finished trials the sampler was given for this one
  std::optional<double> heartbeat_age;  // running: seconds since its worker last beat

  // The values reported by the latest attempt.
  const std::vector<std::pair<int64_t, double>>& intermediate() const;
};

}  // namespace tessera::sweep
