// A sweep: trials proposed by the sampler, run as child processes (or in this process with
// --isolation none), pruned on their intermediate values, and recorded in the study store.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "sweep/store.h"
#include "sweep/train_flags.h"

namespace tessera::sweep {

// Runs `tessera train ARGS...` inside this process and returns its exit code; each report line
// goes to the callback (tools/commands.h, run_train_in_process).
using InProcessTrain = std::function<int(const std::vector<std::string>& args,
                                         const std::function<void(const std::string& json_line)>& report)>;

struct SweepOptions {
  std::string study;  // a file (SQLite) or a postgresql:// URL
  // The study's settings: a new study gets them, an existing one must have them (UsageError
  // naming each difference otherwise) and grows to target_trials.
  StudyConfig config;
  // False: take the study's settings (--resume alone); only target_trials counts (0: the study's).
  bool settings_given = true;
  bool resume = false;  // the study must exist
  // Variables the study's stored search space may set in trials' environments (--allow-env):
  // the space a run takes from the study (settings_given false) is checked as the command line
  // is, and an env: parameter it did not give is refused unless named here.
  std::set<std::string> allowed_environment;
  TrainFlags train;     // train's flags, from the code that defines them
  // A running trial whose worker has not beaten for this long is interrupted and run again.
  double heartbeat_grace = 60;
  int parallel = 1;
  std::vector<int> devices;    // given to trials in turn as --device; empty: train chooses
  double trial_timeout = 0;    // seconds; 0: none
  double timeout_grace = 10;   // seconds between SIGTERM and SIGKILL
  bool oom_retry = false;
  int64_t min_batch = 1;       // --oom-retry goes no lower
  std::vector<std::string> tessera;  // the tessera executable: {path}
  InProcessTrain in_process;          // set: --isolation none
};

// Runs the sweep to the study's trial count; every trial is recorded, whatever its state. With
// other workers on the study it also waits for their trials, and reruns those whose worker
// died. Throws UsageError or BadInput for a sweep that cannot work, and also when a trial fails
// with exit code 2 or 5 before any trial completed (every trial would: bad flags, missing data).
// SIGINT, SIGTERM and SIGHUP stop the trials, record them as interrupted, and end the sweep
// with the signal.
void run_sweep(const SweepOptions& options);

}  // namespace tessera::sweep
