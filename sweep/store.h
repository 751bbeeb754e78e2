// The study store: one SQLite file in WAL mode with the study's settings, its trials and every
// attempt of each trial. The sweep is its only writer; --show and --export read it, also while
// a sweep runs. Each change is one transaction, so a sweep killed at any point loses nothing
// that had finished.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "sweep/space.h"
#include "sweep/trial.h"

struct sqlite3;

namespace tessera::sweep {

struct StudyConfig {
  Direction direction = Direction::minimize;
  std::string sampler = "tpe", pruner = "none";
  uint64_t seed = 0;
  int target_trials = 0;
  SearchSpace space;
  std::vector<std::string> train_flags;  // the fixed flags after `--`
};

class StudyStore {
 public:
  enum class Mode { read_only, read_write };
  // read_only needs an existing study (BadInput otherwise); read_write creates the file if
  // needed. A file that is not a tessera study is BadInput naming it.
  StudyStore(const std::filesystem::path& path, Mode mode);
  ~StudyStore();
  StudyStore(const StudyStore&) = delete;
  StudyStore& operator=(const StudyStore&) = delete;

  bool has_study() const;
  void create_study(const StudyConfig& config);
  StudyConfig study() const;
  void set_target_trials(int trials);

  // Every trial, by number, with its attempts.
  std::vector<Trial> trials() const;
  // Attempts left running by a killed sweep become interrupted, and so do their trials (the
  // sweep runs those again); returns how many trials that was.
  int mark_interrupted();

  void add_trial(int number, const nlohmann::json& params);
  // The trial is running again with this new attempt.
  void start_attempt(int number, const Attempt& attempt);
  void record_intermediate(int number, const Attempt& attempt);
  // Writes the attempt's outcome and the trial's state and value together.
  void finish_attempt(int number, const Attempt& attempt, TrialState trial_state, std::optional<double> trial_value);

 private:
  void initialize(Mode mode);
  int64_t trial_id(int number) const;
  void execute(const char* sql) const;

  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
};

}  // namespace tessera::sweep
