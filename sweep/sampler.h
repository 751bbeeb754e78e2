// Samplers propose the parameters of the next trial from the trials so far.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sweep/space.h"
#include "sweep/trial.h"

namespace tessera::sweep {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Parameters (name -> value) for trial `number`; `trials` is every trial of the study so far.
  // The same seed, number and trials give the same parameters, so a resumed sweep goes on as
  // the killed one would have.
  virtual nlohmann::json sample(int number, const std::vector<Trial>& trials) = 0;
  // How many trials the sampler can propose: a grid's size; unlimited otherwise.
  virtual std::optional<size_t> capacity() const { return std::nullopt; }
};

// The tree-structured Parzen estimator as Optuna describes it (Bergstra et al. 2011): after
// `startup_trials` random trials, the trials are split into the best gamma(n) = min(ceil(0.1 n), 25)
// and the rest; each parameter gets a Parzen density l(x) over the best and g(x) over the rest
// (truncated Gaussians with a prior component), and of `candidates` draws from l(x) the one with
// the largest l(x)/g(x) is taken.
struct TpeOptions {
  int startup_trials = 10;
  int candidates = 24;
  double prior_weight = 1.0;
};

// `name` is tpe, random or grid; throws UsageError (--sampler) for anything else or a grid that
// cannot be made.
std::unique_ptr<Sampler> make_sampler(std::string_view name, const SearchSpace& space, Direction direction,
                                      uint64_t seed, TpeOptions tpe = {});

}  // namespace tessera::sweep
