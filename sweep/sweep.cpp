#include "sweep/sweep.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "common/error.h"
#include "common/json_input.h"
#include "common/mpi_launcher.h"
#include "common/progress.h"
#include "common/run_summary.h"
#include "sweep/child.h"
#include "sweep/database.h"
#include "sweep/process_scope.h"
#include "sweep/pruner.h"
#include "sweep/report.h"
#include "sweep/sampler.h"
#include "sweep/train_flags.h"

namespace tessera::sweep {

namespace {

using Clock = std::chrono::steady_clock;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t integer_flag(const std::string& text, std::string_view flag) {
  try {
    size_t used = 0;
    int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw UsageError(std::string(flag) + ": '" + text + "' is not a whole number");
}

// host/pid/start time: unique among the workers of a study.
std::string worker_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "/" + std::to_string(getpid()) + "/" +
         std::to_string(static_cast<int64_t>(now_seconds() * 1000) % 100000000);
}

// A trial running as a child process.
struct Running {
  int number = 0;
  std::unique_ptr<ChildProcess> child;
  enum class Stop { none, pruned, timeout } stop = Stop::none;
  Clock::time_point deadline = Clock::time_point::max();  // --trial-timeout
  Clock::time_point kill_at = Clock::time_point::max();   // SIGKILL after SIGTERM's grace
  bool final_seen = false;
};

class SweepRun {
 public:
  explicit SweepRun(const SweepOptions& options) : options_(options) {}

  void run() {
    open_study();
    Progress progress("sweep", static_cast<uint64_t>(target_));
    progress_ = &progress;
    if (target_ < config_.target_trials)
      progress.event({{"warning", "the grid has " + std::to_string(target_) + " points; running " +
                                      std::to_string(target_) + " trials, not " + std::to_string(config_.target_trials)}});
    report_progress();
    if (options_.in_process) {
      run_in_process();
    } else {
      StopSignals signals;
      signals_ = &signals;
      run_isolated();
      if (signals.received()) {
        store_->release(worker_);
        progress.event({{"stopped_by_signal", signals.received()}});
        signals.die();
      }
      signals_ = nullptr;
    }
    progress.finish();
    trials_ = store_->trials();
    print_result(summary_json(trials_, config_.direction), format_table(trials_, config_));
    if (stop_code_) throw Error(static_cast<ExitCode>(stop_code_), "sweep stopped: " + stop_message_);
  }

 private:
  void open_study() {
    if (options_.in_process) {
      if (is_postgres_location(options_.study))
        throw UsageError("--isolation none: a trial in this process cannot beat for a PostgreSQL study; use a study file");
      if (options_.parallel != 1) throw UsageError("--parallel: trials in one process (--isolation none) run one at a time");
      if (options_.trial_timeout > 0) throw UsageError("--trial-timeout needs --isolation process");
    }
    if (options_.parallel < 1) throw UsageError("--parallel must be at least 1");
    if (!(options_.heartbeat_grace > 0)) throw UsageError("--heartbeat-grace must be above 0 seconds");
    if (options_.settings_given) {
      config_ = options_.config;
      if (config_.target_trials < 1) throw UsageError("--trials must be at least 1");
      prepare();  // before the study is touched: a command that cannot work leaves nothing behind
    }
    bool must_exist = options_.resume || !options_.settings_given;
    if (must_exist && !is_postgres_location(options_.study) && !std::filesystem::exists(options_.study))
      throw BadInput(options_.study + ": no study to resume");
    store_ = std::make_unique<StudyStore>(options_.study, StudyStore::Mode::read_write);
    if (must_exist && !store_->has_study())
      throw BadInput(store_->name() + ": no study to resume");
    if (options_.settings_given) {
      auto stored = store_->create_or_load(config_);
      if (auto differences = setting_differences(stored, config_); !differences.empty()) {
        std::string message = "--study " + store_->name() + " holds a study with other settings:";
        for (auto& difference : differences) message += "\n  " + difference;
        throw UsageError(message + "\nrun the study's command (tessera sweep --study " + store_->name() +
                         " --show lists it), or name another study");
      }
    } else {
      config_ = store_->study();
      check_stored_space(config_.space, store_->name(), options_.allowed_environment);
      if (options_.config.target_trials > 0) config_.target_trials = options_.config.target_trials;
      prepare();
    }
    if (config_.target_trials > 0) store_->raise_target_trials(config_.target_trials);
    config_.target_trials = store_->study().target_trials;
    // A file's lock says that no other sweep runs its trials: the running ones died with theirs.
    if (!store_->is_shared()) store_->mark_interrupted();
    trials_ = store_->trials();
    target_ = config_.target_trials;
    if (auto capacity = sampler_->capacity(); capacity && *capacity < static_cast<size_t>(target_))
      target_ = static_cast<int>(*capacity);
  }

  // Checks everything a trial depends on before the first one starts.
  void prepare() {
    sampler_ = make_sampler(config_.sampler, config_.space, config_.direction, config_.seed);
    pruner_ = make_pruner(config_.pruner, config_.direction);
    if (pruner_ && options_.in_process) throw UsageError("--pruner needs --isolation process (a trial in this process cannot be stopped)");
    check_train_flags(options_.train, config_.train_flags, config_.space, !options_.devices.empty(),
                      config_.target_trials);
    if (options_.train.defaults.contains("--batch")) {
      auto& text = options_.train.defaults.at("--batch");
      std::from_chars(text.data(), text.data() + text.size(), default_batch_);
    }
    if (!options_.devices.empty()) check_devices();
  }

  void check_devices() const {
    std::vector<std::string> info_command = options_.tessera;
    info_command.insert(info_command.end(), {"info", "--json"});
    auto info = run_captured(info_command);
    auto parsed = try_parse_json_input(info.output).value_or(nlohmann::json());
    if (!WIFEXITED(info.wait_status) || WEXITSTATUS(info.wait_status) != 0 || !parsed.is_object() ||
        !parsed.contains("devices") || !parsed["devices"].is_array())
      throw Error(ExitCode::runtime_error, "'tessera info --json' failed: " + info.errors);
    std::string present;
    for (auto& device : parsed["devices"])
      present += (present.empty() ? "" : ", ") + std::to_string(device.value("index", 0)) + " " + device.value("name", "");
    for (int index : options_.devices)
      if (index < 0 || static_cast<size_t>(index) >= parsed["devices"].size())
        throw UsageError("--devices: there is no device " + std::to_string(index) + " (devices here: " +
                         (present.empty() ? "none" : present) + ")");
  }

  // The trial to run next: one of this worker's waiting for another attempt (--oom-retry), else
  // one claimed from the study (interrupted, or new).
  std::optional<int> next_trial() {
    if (stop_code_ || (signals_ && signals_->received())) return std::nullopt;
    if (!rerun_.empty()) {
      int number = rerun_.front();
      rerun_.pop_front();
      return number;
    }
    // Nothing was left to claim: look again at the next heartbeat, not at every line a child writes.
    if (Clock::now() < claim_again_) return std::nullopt;
    std::optional<size_t> capacity = sampler_->capacity();
    auto claim = store_->claim_trial(worker_, options_.heartbeat_grace, capacity,
                                     [&](int number, const std::vector<Trial>& trials) { return sampler_->sample(number, trials); });
    if (!claim) {
      claim_again_ = Clock::now() + beat_interval();
      return std::nullopt;
    }
    adopt(std::move(claim->trials));
    mine_.insert(claim->number);
    return claim->number;
  }

  // Takes the study as the store has it, keeping this worker's own running trials as they are
  // here (their report lines are newer).
  void adopt(std::vector<Trial> fresh) {
    for (size_t i = 0; i < fresh.size(); ++i)
      if (fresh[i].number != static_cast<int>(i)) throw BadInput(store_->name() + ": trial numbers have gaps");
    for (int number : mine_)
      if (static_cast<size_t>(number) < fresh.size() && static_cast<size_t>(number) < trials_.size())
        fresh[static_cast<size_t>(number)] = std::move(trials_[static_cast<size_t>(number)]);
    trials_ = std::move(fresh);
  }

  std::pair<int64_t, int64_t> initial_batch(const Trial& trial) const {
    auto configured = [&](const char* name) -> int64_t {
      if (trial.params.contains(name) && trial.params[name].is_number_integer()) return trial.params[name].get<int64_t>();
      std::string flag = std::string("--") + name;
      if (auto value = flag_value(config_.train_flags, flag)) return integer_flag(*value, flag);
      return 0;
    };
    return {configured("batch"), configured("accumulate")};
  }

  // The micro-batch and accumulation an --oom-retry would use after `failed`, if any.
  std::optional<std::pair<int64_t, int64_t>> smaller_batch(const Attempt& failed) const {
    if (!options_.oom_retry || failed.state != TrialState::oom) return std::nullopt;
    int64_t batch = failed.batch ? failed.batch : default_batch_;
    int64_t accumulate = failed.accumulate ? failed.accumulate : 1;
    if (batch % 2 != 0 || batch / 2 < options_.min_batch) return std::nullopt;
    return std::pair{batch / 2, accumulate * 2};
  }

  Attempt start_attempt(Trial& trial) {
    check_trial_values(config_.space, trial.params, store_->name() + ": trial " + std::to_string(trial.number));
    Attempt attempt;
    attempt.index = static_cast<int>(trial.attempts.size());
    std::tie(attempt.batch, attempt.accumulate) = initial_batch(trial);
    if (!trial.attempts.empty()) {
      auto& last = trial.attempts.back();
      if (auto smaller = smaller_batch(last)) std::tie(attempt.batch, attempt.accumulate) = *smaller;
      else std::tie(attempt.batch, attempt.accumulate) = std::pair{last.batch, last.accumulate};
    }
    if (!options_.devices.empty()) attempt.device_index = options_.devices[launches_ % options_.devices.size()];
    ++launches_;
    std::vector<std::string> flags = with_trial_number(config_.train_flags, trial.number);
    // runs/{trial}.h5: the folder of a per-trial checkpoint is the sweep's to make.
    if (auto checkpoint = flag_value(config_.train_flags, "--checkpoint"); checkpoint && checkpoint->find("{trial}") != std::string::npos) {
      std::error_code ignored;  // train names the path if it still cannot write there
      std::filesystem::create_directories(std::filesystem::path(*flag_value(flags, "--checkpoint")).parent_path(), ignored);
    }
    for (auto& param : config_.space)
      if (!param.is_environment()) {
        flags.push_back(param.target());
        flags.push_back(value_text(trial.params[param.name]));
      }
    if (attempt.batch) set_flag(flags, "--batch", std::to_string(attempt.batch));
    if (attempt.accumulate) set_flag(flags, "--accumulate", std::to_string(attempt.accumulate));
    if (attempt.device_index >= 0) set_flag(flags, "--device", std::to_string(attempt.device_index));
    // A later attempt of a trial starts it again over the checkpoint its earlier attempt left.
    auto has = [&](const char* flag) { return std::find(flags.begin(), flags.end(), flag) != flags.end(); };
    if (attempt.index > 0 && flag_value(flags, "--checkpoint") && !has("--resume") && !has("--overwrite"))
      flags.emplace_back("--overwrite");
    if (!options_.in_process) set_flag(flags, "--report-fd", std::to_string(ChildProcess::report_descriptor));
    attempt.command = options_.tessera;
    attempt.command.push_back("train");
    attempt.command.insert(attempt.command.end(), flags.begin(), flags.end());
    attempt.started = now_seconds();
    attempt.worker = worker_;
    store_->start_attempt(trial.number, attempt);
    trial.state = TrialState::running;
    trial.attempts.push_back(attempt);
    return attempt;
  }

  Environment environment_of(const Trial& trial) const {
    Environment environment = {{"TESSERA_TRIAL", std::to_string(trial.number)}};
    // A trial trains alone, even when the sweep worker was started by mpirun or srun.
    for (auto& variable : mpi_launcher_variables()) environment.emplace_back(variable, "");
    for (auto& param : config_.space)
      if (param.is_environment()) environment.emplace_back(param.target(), value_text(trial.params[param.name]));
    return environment;
  }

  // The objective in a report line: metrics[objective], or for val_loss the line's value (train's
  // own choice: the training loss when nothing is held out). nullopt: the line does not carry it;
  // NaN: it is not a number.
  std::optional<double> objective_of(const nlohmann::json& record) const {
    auto metrics = record.contains("metrics") ? record["metrics"] : nlohmann::json();
    nlohmann::json value;
    if (metrics.is_object() && metrics.contains(config_.objective)) value = metrics[config_.objective];
    else if (config_.objective == "val_loss" && record.contains("value")) value = record["value"];
    else return std::nullopt;
    return value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
  }

  // Takes one report line; returns true when the pruner stops the trial. Lines that do not
  // follow the protocol are ignored: a trial cannot break the sweep.
  bool take_report(int number, const std::string& line, bool& final_seen) {
    auto parsed = try_parse_json_input(line);
    if (!parsed || !parsed->is_object()) return false;
    const nlohmann::json& record = *parsed;
    Trial& trial = trials_[static_cast<size_t>(number)];
    Attempt& attempt = trial.attempts.back();
    auto type = record.value("type", nlohmann::json()).is_string() ? record["type"].get<std::string>() : "";
    auto field = [&](const char* name) { return record.contains(name) ? record[name] : nlohmann::json(); };
    if (field("metrics").is_object()) attempt.metrics = field("metrics");
    // The batch train chose without --batch: what --oom-retry halves.
    if (type == "batch" && !attempt.batch && field("batch").is_number_integer() && field("batch").get<int64_t>() > 0) {
      attempt.batch = field("batch").get<int64_t>();
      if (!attempt.accumulate && field("accumulate").is_number_integer()) attempt.accumulate = field("accumulate").get<int64_t>();
      return false;
    }
    if (type == "intermediate" && field("step").is_number_integer()) {
      auto value = objective_of(record);
      if (!value) return false;
      attempt.intermediate.emplace_back(field("step").get<int64_t>(), *value);
      unrecorded_.insert(number);
      record_intermediate(number);
      return pruner_ && pruner_->should_prune(trial, trials_);
    }
    if (type == "final") {
      final_seen = true;
      attempt.value = objective_of(record);
      if (field("peak_device_bytes").is_number_unsigned()) attempt.peak_device_bytes = field("peak_device_bytes").get<uint64_t>();
      if (field("device").is_string()) attempt.device = field("device").get<std::string>();
    }
    return false;
  }

  // Writes a trial's new intermediate values to the study, at most every record_interval
  // (finish() writes them all with the attempt): each write holds every value so far, so
  // writing each line as it came would make a long report quadratic.
  void record_intermediate(int number) {
    if (!unrecorded_.count(number)) return;
    auto time = Clock::now();
    auto last = recorded_at_.find(number);
    if (last != recorded_at_.end() && time < last->second + record_interval) return;
    unrecorded_.erase(number);
    recorded_at_[number] = time;
    store_->record_intermediate(number, trials_[static_cast<size_t>(number)].attempts.back());
  }

  // A final report without the objective is a failed trial (every trial would fail the same
  // way); one whose objective is not a number diverged.
  static TrialState state_of(Running::Stop stop, std::optional<int> exit_code, bool final_seen,
                             std::optional<double> value) {
    if (exit_code == 0 && final_seen) return !value ? TrialState::failed : std::isfinite(*value) ? TrialState::complete : TrialState::diverged;
    if (stop == Running::Stop::pruned) return TrialState::pruned;
    if (stop == Running::Stop::timeout) return TrialState::timeout;
    if (!exit_code) return TrialState::crashed;
    switch (static_cast<ExitCode>(*exit_code)) {
      case ExitCode::out_of_device_memory: return TrialState::oom;
      case ExitCode::diverged: return TrialState::diverged;
      default: return TrialState::failed;
    }
  }

  std::string missing_objective(const Attempt& attempt) const {
    std::string reported;
    if (attempt.metrics.is_object())
      for (auto& [name, value] : attempt.metrics.items())
        if (value.is_number()) reported += (reported.empty() ? "" : ", ") + name;
    return "train reported no " + config_.objective + " (--objective); it reported: " +
           (reported.empty() ? "nothing" : reported);
  }

  void finish(int number, TrialState state, std::optional<int> exit_code, std::optional<int> signal,
              std::string stderr_tail, bool final_seen = false) {
    Trial& trial = trials_[static_cast<size_t>(number)];
    Attempt& attempt = trial.attempts.back();
    bool objective_missing = state == TrialState::failed && exit_code == 0 && final_seen && !attempt.value;
    if (objective_missing) stderr_tail += missing_objective(attempt) + "\n";
    attempt.state = state;
    attempt.exit_code = exit_code;
    attempt.signal = signal;
    attempt.stderr_tail = std::move(stderr_tail);
    attempt.finished = now_seconds();
    attempt.sweep_rss_bytes = resident_bytes();
    bool retry = smaller_batch(attempt).has_value();
    unrecorded_.erase(number);  // the attempt's record below holds them all
    recorded_at_.erase(number);
    trial.state = retry ? TrialState::running : state;
    trial.value = state == TrialState::complete ? attempt.value : std::nullopt;
    if (!store_->finish_attempt(number, attempt, trial.state, trial.value)) {
      // Another worker took the trial over (this one's heartbeat was late): its run counts.
      progress_->event({{"trial", number}, {"warning", "the trial was taken over by another worker; this run is not recorded"}});
      mine_.erase(number);
      return;
    }
    if (retry) rerun_.push_front(number);
    else mine_.erase(number);
    nlohmann::json event = {{"event", "trial"}, {"trial", number}, {"attempt", attempt.index}, {"state", to_string(state)},
                            {"seconds", attempt.finished - attempt.started}};
    if (attempt.value) event["value"] = *attempt.value;
    if (exit_code) event["exit_code"] = *exit_code;
    if (signal) event["signal"] = *signal;
    if (retry) event["retry_batch"] = smaller_batch(attempt)->first;
    progress_->event(event, trial_line(event));
    bool nothing_worked = std::none_of(trials_.begin(), trials_.end(), [](auto& t) { return t.state == TrialState::complete; });
    if (state == TrialState::failed && nothing_worked && exit_code &&
        (objective_missing || *exit_code == static_cast<int>(ExitCode::bad_usage) ||
         *exit_code == static_cast<int>(ExitCode::bad_input))) {
      stop_code_ = objective_missing ? static_cast<int>(ExitCode::bad_usage) : *exit_code;
      auto tail = attempt.stderr_tail;
      while (!tail.empty() && tail.back() == '\n') tail.pop_back();
      stop_message_ = "trial " + std::to_string(number) + " exited with " + std::to_string(*exit_code) + ": " +
                      tail.substr(tail.rfind('\n') == std::string::npos ? 0 : tail.rfind('\n') + 1);
    }
  }

  std::optional<double> current_value(int number) const { return trials_[static_cast<size_t>(number)].attempts.back().value; }

  void report_progress() {
    uint64_t done = 0;
    std::optional<double> best;
    for (auto& trial : trials_) {
      done += is_finished(trial.state);
      if (trial.value && (!best || better(config_.direction, *trial.value, *best))) best = trial.value;
    }
    nlohmann::json fields = {{"running", running_count_}};
    if (best) fields["best"] = *best;
    progress_->update(done, fields);
  }

  void run_isolated() {
    std::vector<Running> running;
    next_beat_ = Clock::now() + beat_interval();
    while (true) {
      while (running.size() < static_cast<size_t>(options_.parallel)) {
        auto number = next_trial();
        if (!number) break;
        Trial& trial = trials_[static_cast<size_t>(*number)];
        Attempt attempt = start_attempt(trial);
        Running started;
        started.number = *number;
        try {
          started.child = std::make_unique<ChildProcess>(attempt.command, environment_of(trial));
        } catch (const Error& e) {
          finish(*number, TrialState::failed, std::nullopt, std::nullopt, e.what());
          continue;
        }
        if (options_.trial_timeout > 0)
          started.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(options_.trial_timeout));
        running.push_back(std::move(started));
      }
      running_count_ = running.size();
      // Stopped: the children are killed and reaped here; run() records them as interrupted.
      if (signals_->received()) return;
      // Other workers' trials may yet come back to be claimed, if their worker dies.
      if (running.empty() && (stop_code_ || !store_->is_shared() || store_->unfinished_trials() == 0)) break;
      wait_for_children(running);
      if (Clock::now() >= next_beat_) {
        store_->heartbeat(worker_);
        next_beat_ = Clock::now() + beat_interval();
      }
      size_t before = running.size();
      std::erase_if(running, [this](Running& r) { return service(r); });
      running_count_ = running.size();
      if (running.size() != before) report_progress();
    }
  }

  // A few beats within the grace period, so that one late beat does not lose a trial.
  Clock::duration beat_interval() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::min(options_.heartbeat_grace / 4, 10.0)));
  }

  // Sleeps until a child has output or has exited, a deadline or the next heartbeat comes, a
  // trial's intermediate values are due in the study, or a stop signal arrives.
  void wait_for_children(const std::vector<Running>& running) {
    std::vector<pollfd> fds = {{signals_->fd(), POLLIN, 0}};
    auto now = Clock::now();
    auto wake = next_beat_;
    for (auto& r : running) {
      for (int fd : {r.child->report_fd(), r.child->stderr_fd(), r.child->exit_fd()})
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});
      // Without a pidfd the child's exit wakes nothing: look again shortly.
      if (r.child->exit_fd() < 0) wake = std::min(wake, now + std::chrono::milliseconds(100));
      if (unrecorded_.count(r.number)) wake = std::min(wake, recorded_at_[r.number] + record_interval);
      wake = std::min({wake, r.stop == Running::Stop::none ? r.deadline : Clock::time_point::max(), r.kill_at});
    }
    auto timeout_ms = static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1));
    poll(fds.data(), fds.size(), timeout_ms);
  }

  // Reads a child's output and acts on it; returns true once its trial is finished. A trial
  // ends when its child exits, not when its pipes close: a grandchild may hold them open.
  bool service(Running& r) {
    take_reports(r, r.child->read_report());
    r.child->read_stderr();
    auto now = Clock::now();
    if (r.stop == Running::Stop::none && now >= r.deadline) stop(r, Running::Stop::timeout);
    if (now >= r.kill_at) {
      r.child->send(SIGKILL);
      r.kill_at = Clock::time_point::max();
    }
    record_intermediate(r.number);
    if (!r.child->try_reap()) return false;
    take_reports(r, r.child->finish_output());
    int status = r.child->wait_status();
    std::optional<int> exit_code, signal;
    if (WIFEXITED(status)) exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) signal = WTERMSIG(status);
    finish(r.number, state_of(r.stop, exit_code, r.final_seen, current_value(r.number)), exit_code, signal,
           r.child->protocol_errors() + r.child->stderr_tail(), r.final_seen);
    return true;
  }

  void take_reports(Running& r, const std::vector<std::string>& lines) {
    for (auto& line : lines)
      if (take_report(r.number, line, r.final_seen) && r.stop == Running::Stop::none) stop(r, Running::Stop::pruned);
  }

  void stop(Running& r, Running::Stop why) {
    r.stop = why;
    r.child->send(SIGTERM);
    r.kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(options_.timeout_grace));
  }

  void run_in_process() {
    while (auto number = next_trial()) {
      Trial& trial = trials_[static_cast<size_t>(*number)];
      Attempt attempt = start_attempt(trial);
      std::vector<std::string> args(attempt.command.begin() + static_cast<std::ptrdiff_t>(options_.tessera.size()) + 1,
                                    attempt.command.end());
      running_count_ = 1;
      report_progress();
      bool final_seen = false;
      int exit_code = 0;
      std::string errors;
      {
        ScopedEnvironment environment(environment_of(trial));
        StderrCapture capture;
        try {
          exit_code = options_.in_process(args, [&](const std::string& line) { take_report(*number, line, final_seen); });
        } catch (const std::exception& e) {
          exit_code = exit_code_of(e);
          std::fprintf(stderr, "%s\n", e.what());
        }
        errors = capture.tail();
      }
      running_count_ = 0;
      finish(*number, state_of(Running::Stop::none, exit_code, final_seen, current_value(*number)), exit_code,
             std::nullopt, errors, final_seen);
      report_progress();
    }
  }

  const SweepOptions& options_;
  StudyConfig config_;
  std::unique_ptr<StudyStore> store_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<Pruner> pruner_;
  std::vector<Trial> trials_;  // the whole study, as of this worker's last claim
  std::set<int> mine_;         // the trials this worker runs
  // Trials whose latest intermediate values are not in the study yet, and when each was last
  // written there.
  static constexpr Clock::duration record_interval = std::chrono::seconds(1);
  std::set<int> unrecorded_;
  std::map<int, Clock::time_point> recorded_at_;
  std::deque<int> rerun_;
  const std::string worker_ = worker_name();
  StopSignals* signals_ = nullptr;
  Clock::time_point next_beat_, claim_again_;
  int target_ = 0;
  int64_t default_batch_ = 0;
  size_t launches_ = 0, running_count_ = 0;
  Progress* progress_ = nullptr;
  int stop_code_ = 0;
  std::string stop_message_;
};

}  // namespace

void run_sweep(const SweepOptions& options) { SweepRun(options).run(); }

}  // namespace tessera::sweep
