// The study store: the study's settings, its trials and every attempt of each trial, in one
// SQLite file (WAL; one sweep at a time, which holds a lock on the file) or in PostgreSQL (any
// number of sweep workers on any machines). Each change is one checked transaction, so a sweep
// killed at any point loses nothing that had finished. Workers claim trials one at a time under
// a lock on the study's row, so each trial is claimed once and every sampler sees every trial
// finished before its claim; a running trial carries its worker's heartbeat, and one whose
// worker stopped beating for the grace period is interrupted and claimed again.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sweep/space.h"
#include "sweep/trial.h"

namespace tessera::sweep {

class Database;

struct StudyConfig {
  Direction direction = Direction::minimize;
  std::string objective = "val_loss";  // a metric of train's final report
  std::string sampler = "tpe", pruner = "none";
  uint64_t seed = 0;
  int target_trials = 0;
  SearchSpace space;
  std::vector<std::string> train_flags;  // the fixed flags after `--`
};

// Each setting of `here` that differs from the study's, e.g. "--sampler: tpe in the study, random
// here"; the trial count is not a setting (a study can grow).
std::vector<std::string> setting_differences(const StudyConfig& study, const StudyConfig& here);

class StudyStore {
 public:
  enum class Mode { read_only, read_write };
  // `location` is a file (SQLite) or a postgresql:// URL. read_only needs an existing study
  // (BadInput otherwise); read_write creates the tables if needed and, for a file, locks it
  // (UsageError while another sweep holds it). Anything that is not a tessera study is BadInput.
  StudyStore(const std::string& location, Mode mode);
  ~StudyStore();
  StudyStore(const StudyStore&) = delete;
  StudyStore& operator=(const StudyStore&) = delete;

  const std::string& name() const;
  // PostgreSQL: several workers may share the study.
  bool is_shared() const;

  bool has_study();
  // Creates the study from `config` unless it exists; returns the study's settings either way
  // (several workers starting at once create it once).
  StudyConfig create_or_load(const StudyConfig& config);
  StudyConfig study();
  // The study's target goes up to `trials`, never down.
  void raise_target_trials(int trials);

  // Every trial, by number, with its attempts.
  std::vector<Trial> trials();
  // Every running trial becomes interrupted (with the file's lock held no sweep runs them);
  // returns how many.
  int mark_interrupted();

  struct Claim {
    int number = 0;
    std::vector<Trial> trials;  // the study as the claim saw it, the claimed trial included
  };
  using Sample = std::function<nlohmann::json(int number, const std::vector<Trial>& trials)>;
  // In one transaction: running trials whose worker has not beaten for `grace_seconds` become
  // interrupted; the lowest interrupted trial is claimed, else while the study has fewer trials
  // than its target (at most `capacity`) a new one is sampled. nullopt: nothing to claim.
  std::optional<Claim> claim_trial(const std::string& worker, double grace_seconds, std::optional<size_t> capacity,
                                   const Sample& sample);
  // Trials that are running (by any worker) or interrupted: a worker with nothing to claim
  // waits for them, in case their worker dies.
  int unfinished_trials();
  // Beats for every trial this worker runs; returns how many it still owns.
  int64_t heartbeat(const std::string& worker);

  void start_attempt(int number, const Attempt& attempt);
  void record_intermediate(int number, const Attempt& attempt);
  // Writes the attempt's outcome and the trial's state and value together. Returns false, and
  // records the attempt as interrupted, when the trial is no longer this worker's (its heartbeat
  // was late and another worker took it over).
  bool finish_attempt(int number, const Attempt& attempt, TrialState trial_state, std::optional<double> trial_value);
  // This worker's running trials and attempts become interrupted (the sweep was stopped).
  void release(const std::string& worker);

 private:
  void initialize(Mode mode);
  void upgrade_from_version_1();
  int64_t trial_id(int number);
  std::vector<Trial> load_trials();

  std::unique_ptr<Database> database_;
};

}  // namespace tessera::sweep
