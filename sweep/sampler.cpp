#include "sweep/sampler.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <tuple>

#include "common/error.h"

namespace tessera::sweep {

namespace {

using Rng = std::mt19937_64;

Rng trial_rng(uint64_t seed, int number) {
  std::seed_seq sequence{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                         static_cast<uint32_t>(number)};
  return Rng(sequence);
}

double uniform(Rng& rng, double low, double high) { return std::uniform_real_distribution<double>(low, high)(rng); }

nlohmann::json random_params(const SearchSpace& space, Rng& rng) {
  nlohmann::json params = nlohmann::json::object();
  for (auto& param : space) {
    auto [low, high] = internal_bounds(param);
    params[param.name] = from_internal(param, uniform(rng, low, high));
  }
  return params;
}

class RandomSampler : public Sampler {
 public:
  RandomSampler(SearchSpace space, uint64_t seed) : space_(std::move(space)), seed_(seed) {}
  nlohmann::json sample(int number, const std::vector<Trial>&) override {
    Rng rng = trial_rng(seed_, number);
    return random_params(space_, rng);
  }

 private:
  SearchSpace space_;
  uint64_t seed_;
};

// Every combination once, in order, the last parameter changing fastest.
class GridSampler : public Sampler {
 public:
  explicit GridSampler(const SearchSpace& space) {
    if (space.empty()) throw UsageError("--sampler grid: the grid is empty (no --param)");
    for (auto& param : space) {
      names_.push_back(param.name);
      values_.push_back(grid_values(param));
    }
  }
  nlohmann::json sample(int number, const std::vector<Trial>&) override {
    size_t index = static_cast<size_t>(number) % *capacity();
    nlohmann::json params = nlohmann::json::object();
    for (size_t p = values_.size(); p-- > 0;) {
      params[names_[p]] = values_[p][index % values_[p].size()];
      index /= values_[p].size();
    }
    return params;
  }
  std::optional<size_t> capacity() const override {
    size_t size = 1;
    for (auto& values : values_) size *= values.size();
    return size;
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<nlohmann::json>> values_;
};

// A weighted mixture of Gaussians truncated to [low, high], one per observation plus a broad
// prior in the middle.
class ParzenEstimator {
 public:
  ParzenEstimator(const std::vector<double>& observations, const std::vector<double>& weights, double low,
                  double high, double prior_weight)
      : low_(low), high_(high) {
    double range = high - low, prior = 0.5 * (low + high);
    double min_sigma = range / std::min(100.0, 2.0 + static_cast<double>(observations.size()));
    // Bandwidths come from the gaps between neighbouring centres (the prior's among them): the
    // wider gap on either side, except that the outermost centres look inwards only.
    std::vector<double> centres = observations;
    centres.push_back(prior);
    std::vector<double> sorted = centres;
    std::sort(sorted.begin(), sorted.end());
    auto bandwidth = [&](double mu) {
      size_t i = static_cast<size_t>(std::lower_bound(sorted.begin(), sorted.end(), mu) - sorted.begin());
      double left_gap = mu - (i == 0 ? low : sorted[i - 1]);
      double right_gap = (i + 1 == sorted.size() ? high : sorted[i + 1]) - mu;
      if (sorted.size() >= 2 && i == 0) return right_gap;
      if (sorted.size() >= 2 && i + 1 == sorted.size()) return left_gap;
      return std::max(left_gap, right_gap);
    };
    for (size_t i = 0; i < observations.size(); ++i)
      add(observations[i], std::clamp(bandwidth(observations[i]), min_sigma, range), weights[i]);
    add(prior, range, prior_weight);
    double total = 0;
    for (auto& c : components_) total += c.weight;
    for (auto& c : components_) c.log_weight = std::log(c.weight / total);
  }

  double sample(Rng& rng) const {
    std::vector<double> weights;
    for (auto& c : components_) weights.push_back(c.weight);
    auto& c = components_[std::discrete_distribution<size_t>(weights.begin(), weights.end())(rng)];
    std::normal_distribution<double> normal(c.mu, c.sigma);
    for (int tries = 0; tries < 100; ++tries) {
      double x = normal(rng);
      if (x >= low_ && x <= high_) return x;
    }
    return uniform(rng, low_, high_);
  }

  double log_density(double x) const {
    double largest = -INFINITY;
    std::vector<double> terms;
    for (auto& c : components_) {
      double z = (x - c.mu) / c.sigma;
      terms.push_back(c.log_weight - 0.5 * z * z - std::log(c.sigma) - 0.5 * std::log(2 * std::numbers::pi) -
                      c.log_mass);
      largest = std::max(largest, terms.back());
    }
    double sum = 0;
    for (double t : terms) sum += std::exp(t - largest);
    return largest + std::log(sum);
  }

 private:
  struct Component {
    double mu, sigma, weight, log_weight = 0, log_mass;
  };
  static double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::numbers::sqrt2); }
  void add(double mu, double sigma, double weight) {
    double mass = normal_cdf((high_ - mu) / sigma) - normal_cdf((low_ - mu) / sigma);
    components_.push_back({mu, sigma, weight, 0, std::log(std::max(mass, 1e-300))});
  }

  double low_, high_;
  std::vector<Component> components_;
};

// Category probabilities: a mixture of one kernel per observation (most of its mass on the
// observed category, the rest spread over all, more so when observations are few) and a
// uniform prior kernel.
class CategoricalEstimator {
 public:
  CategoricalEstimator(const std::vector<double>& observations, const std::vector<double>& weights, size_t categories,
                       double prior_weight)
      : probabilities_(categories, 0.0) {
    double k = static_cast<double>(categories), spread = prior_weight / static_cast<double>(observations.size() + 1);
    double total_weight = prior_weight;
    for (double w : weights) total_weight += w;
    for (double& p : probabilities_) p = prior_weight / total_weight / k;
    for (size_t i = 0; i < observations.size(); ++i) {
      double kernel_weight = weights[i] / total_weight, kernel_mass = 1.0 + spread * k;
      for (double& p : probabilities_) p += kernel_weight * spread / kernel_mass;
      probabilities_[static_cast<size_t>(observations[i])] += kernel_weight / kernel_mass;
    }
  }
  double sample(Rng& rng) const {
    return static_cast<double>(std::discrete_distribution<size_t>(probabilities_.begin(), probabilities_.end())(rng));
  }
  double log_density(double x) const { return std::log(probabilities_[static_cast<size_t>(x)]); }

 private:
  std::vector<double> probabilities_;
};

// Optuna's default weights: equal for the latest 25 observations, ramping down for older ones.
std::vector<double> observation_weights(size_t count) {
  const size_t flat = 25;
  std::vector<double> weights(count, 1.0);
  if (count <= flat) return weights;
  size_t ramp = count - flat;
  for (size_t i = 0; i < ramp; ++i)
    weights[i] = 1.0 / static_cast<double>(count) +
                 (1.0 - 1.0 / static_cast<double>(count)) * static_cast<double>(i) / static_cast<double>(ramp);
  return weights;
}

class TpeSampler : public Sampler {
 public:
  TpeSampler(SearchSpace space, Direction direction, uint64_t seed, TpeOptions options)
      : space_(std::move(space)), direction_(direction), seed_(seed), options_(options) {}

  nlohmann::json sample(int number, const std::vector<Trial>& trials) override {
    Rng rng = trial_rng(seed_, number);
    auto ranked = rank(trials);
    if (ranked.size() < static_cast<size_t>(options_.startup_trials) || ranked.empty())
      return random_params(space_, rng);
    size_t below_count = std::min<size_t>(static_cast<size_t>(std::ceil(0.1 * static_cast<double>(ranked.size()))), 25);
    std::vector<const Trial*> below(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(below_count));
    std::vector<const Trial*> above(ranked.begin() + static_cast<std::ptrdiff_t>(below_count), ranked.end());
    nlohmann::json params = nlohmann::json::object();
    for (auto& param : space_) params[param.name] = sample_one(param, below, above, rng);
    return params;
  }

 private:
  // The trials that inform the estimate, best first: complete ones by value, then pruned ones
  // (those that got further first, then by their last value), then diverged ones.
  std::vector<const Trial*> rank(const std::vector<Trial>& trials) const {
    using Key = std::tuple<int, int64_t, double>;
    std::vector<std::pair<Key, const Trial*>> keyed;
    double sign = direction_ == Direction::minimize ? 1.0 : -1.0;
    for (auto& trial : trials) {
      if (trial.state == TrialState::complete && trial.value && std::isfinite(*trial.value))
        keyed.push_back({{0, 0, sign * *trial.value}, &trial});
      else if (trial.state == TrialState::pruned && !trial.intermediate().empty())
        keyed.push_back({{1, -trial.intermediate().back().first, sign * trial.intermediate().back().second}, &trial});
      else if (trial.state == TrialState::diverged)
        keyed.push_back({{2, 0, 0.0}, &trial});
    }
    std::stable_sort(keyed.begin(), keyed.end(), [](auto& a, auto& b) { return a.first < b.first; });
    std::vector<const Trial*> ranked;
    for (auto& [key, trial] : keyed) ranked.push_back(trial);
    return ranked;
  }

  // Observations of one parameter on its internal axis, oldest trial first, with their weights.
  static std::pair<std::vector<double>, std::vector<double>> observations(const Param& param,
                                                                          std::vector<const Trial*> trials) {
    std::sort(trials.begin(), trials.end(), [](auto* a, auto* b) { return a->number < b->number; });
    std::vector<double> values;
    for (auto* trial : trials)
      if (trial->params.contains(param.name)) values.push_back(to_internal(param, trial->params[param.name]));
    return {values, observation_weights(values.size())};
  }

  nlohmann::json sample_one(const Param& param, const std::vector<const Trial*>& below,
                            const std::vector<const Trial*>& above, Rng& rng) const {
    auto [below_values, below_weights] = observations(param, below);
    auto [above_values, above_weights] = observations(param, above);
    auto best_of = [&](const auto& good, const auto& bad) {
      double best_x = 0, best_score = -INFINITY;
      for (int i = 0; i < options_.candidates; ++i) {
        // Integers and choices are scored where they land, so l and g see the same point.
        double x = to_internal(param, from_internal(param, good.sample(rng)));
        double score = good.log_density(x) - bad.log_density(x);
        if (score > best_score) {
          best_score = score;
          best_x = x;
        }
      }
      return from_internal(param, best_x);
    };
    if (param.distribution == Distribution::choice) {
      CategoricalEstimator good(below_values, below_weights, param.choices.size(), options_.prior_weight);
      CategoricalEstimator bad(above_values, above_weights, param.choices.size(), options_.prior_weight);
      return best_of(good, bad);
    }
    auto [low, high] = internal_bounds(param);
    ParzenEstimator good(below_values, below_weights, low, high, options_.prior_weight);
    ParzenEstimator bad(above_values, above_weights, low, high, options_.prior_weight);
    return best_of(good, bad);
  }

  SearchSpace space_;
  Direction direction_;
  uint64_t seed_;
  TpeOptions options_;
};

}  // namespace

std::unique_ptr<Sampler> make_sampler(std::string_view name, const SearchSpace& space, Direction direction,
                                      uint64_t seed, TpeOptions tpe) {
  if (name == "tpe") return std::make_unique<TpeSampler>(space, direction, seed, tpe);
  if (name == "random") return std::make_unique<RandomSampler>(space, seed);
  if (name == "grid") return std::make_unique<GridSampler>(space);
  throw UsageError("--sampler: '" + std::string(name) + "' is not tpe, random or grid");
}

}  // namespace tessera::sweep
