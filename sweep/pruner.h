// Pruners decide, on each intermediate value a trial reports, whether to stop it early.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "sweep/trial.h"

namespace tessera::sweep {

class Pruner {
 public:
  virtual ~Pruner() = default;
  // `trial` has just reported its latest intermediate value; `trials` is the whole study
  // (`trial` among them, other trials running or finished).
  virtual bool should_prune(const Trial& trial, const std::vector<Trial>& trials) const = 0;
};

// Median (as Optuna's MedianPruner): once `startup_trials` trials are complete, a trial whose
// best value so far is worse than the median of the complete trials at the same step stops.
struct MedianOptions {
  int startup_trials = 5;
  int64_t warmup_steps = 0;
};

// Asynchronous successive halving (Li et al. 2018, as Optuna's SuccessiveHalvingPruner): rungs
// at steps min_resource * reduction_factor^k; a trial reaching a rung goes on only if its value
// there is in the best 1/reduction_factor of the values every trial had at that rung (the
// best one while fewer than reduction_factor trials got there).
struct AshaOptions {
  int64_t min_resource = 1;
  int64_t reduction_factor = 4;
};

// `name` is none, median or asha; throws UsageError (--pruner) for anything else. none gives null.
std::unique_ptr<Pruner> make_pruner(std::string_view name, Direction direction, MedianOptions median = {},
                                    AshaOptions asha = {});

}  // namespace tessera::sweep
