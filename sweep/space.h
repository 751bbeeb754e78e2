// The search space: one Param per `--param NAME=SPEC`, where NAME is a `train` flag without its
// dashes (lr -> --lr) or env:VAR for an environment variable of the child, and SPEC is
//   uniform:LOW:HIGH   loguniform:LOW:HIGH   int:LOW:HIGH   logint:LOW:HIGH   choice:A,B,C
// An empty choice of an environment variable (env:TESSERA_FAULT=choice:,nan) leaves it unset.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::sweep {

enum class Distribution { uniform, log_uniform, integer, log_integer, choice };

struct Param {
  std::string name;
  Distribution distribution = Distribution::uniform;
  double low = 0, high = 0;             // numeric distributions, inclusive
  std::vector<nlohmann::json> choices;  // numbers stay numbers, anything else is a string

  bool is_environment() const;
  // "--lr" for a flag, "TESSERA_FAULT" for env:TESSERA_FAULT.
  std::string target() const;
};

using SearchSpace = std::vector<Param>;

// Throws UsageError naming --param and saying what is wrong.
Param parse_param(std::string_view text);
// Also rejects a name given twice.
SearchSpace parse_space(const std::vector<std::string>& texts);

// The SPEC as --param takes it: "loguniform:0.0001:0.1", "choice:16,32".
std::string spec_text(const Param& param);

nlohmann::json to_json(const SearchSpace& space);
SearchSpace space_from_json(const nlohmann::json& json);

// Samplers work on one real axis per parameter: the value itself, its logarithm, or the index
// of a choice. Integers own [v-0.5, v+0.5] so that every integer is equally wide.
std::pair<double, double> internal_bounds(const Param& param);
double to_internal(const Param& param, const nlohmann::json& value);
// Clamps into the bounds and rounds integers and choices.
nlohmann::json from_internal(const Param& param, double internal);

// True when `value` is one the parameter can take: one of its choices, or a number within its
// bounds (a whole one for an integer distribution).
bool holds(const Param& param, const nlohmann::json& value);

// A search space a run takes from a study, which anyone who can write the study may have
// edited, checked as --param is: a parameter the command line would refuse is BadInput naming
// `study`; and since an env: parameter can load code into every trial (LD_PRELOAD), one whose
// variable is not in `allowed` (--allow-env) is UsageError.
void check_stored_space(const SearchSpace& space, const std::string& study, const std::set<std::string>& allowed);
// Throws BadInput naming `trial` ("s.sqlite: trial 3") when one of its values is not one the
// space holds.
void check_trial_values(const SearchSpace& space, const nlohmann::json& params, const std::string& trial);

// Every value of a choice or integer parameter; throws UsageError for a continuous one.
std::vector<nlohmann::json> grid_values(const Param& param);

// How a value is written on the child's command line or in its environment: the shortest
// text that reads back as the same number.
std::string value_text(const nlohmann::json& value);

}  // namespace tessera::sweep
