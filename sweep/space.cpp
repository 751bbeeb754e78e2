#include "sweep/space.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "common/error.h"

namespace tessera::sweep {

namespace {

constexpr std::string_view env_prefix = "env:";
// A grid over an integer range wider than this is almost certainly a mistake.
constexpr double max_integer_grid = 100000;

std::string_view trim(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

template <typename Number>
bool parse_number(std::string_view text, Number& out) {
  text = trim(text);
  if (text.empty()) return false;
  if (text.front() == '+') text.remove_prefix(1);
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

nlohmann::json choice_value(std::string_view text) {
  int64_t integer = 0;
  if (parse_number(text, integer)) return integer;
  double real = 0;
  if (parse_number(text, real) && std::isfinite(real)) return real;
  return std::string(text);
}

std::string_view distribution_name(Distribution distribution) {
  switch (distribution) {
    case Distribution::uniform: return "uniform";
    case Distribution::log_uniform: return "loguniform";
    case Distribution::integer: return "int";
    case Distribution::log_integer: return "logint";
    case Distribution::choice: return "choice";
  }
  return "";
}

bool valid_name(std::string_view name) {
  if (name.starts_with(env_prefix)) {
    name.remove_prefix(env_prefix.size());
    return !name.empty() && !std::isdigit(static_cast<unsigned char>(name.front())) &&
           std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  }
  return !name.empty() && name.front() != '-' &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '_';
         });
}

bool is_log(Distribution distribution) {
  return distribution == Distribution::log_uniform || distribution == Distribution::log_integer;
}

bool is_integer(Distribution distribution) {
  return distribution == Distribution::integer || distribution == Distribution::log_integer;
}

}  // namespace

bool Param::is_environment() const { return name.starts_with(env_prefix); }

std::string Param::target() const {
  return is_environment() ? name.substr(env_prefix.size()) : "--" + name;
}

Param parse_param(std::string_view text) {
  auto fail = [&](const std::string& why) {
    return UsageError("--param '" + std::string(text) + "': " + why +
                      " (expected NAME=SPEC with SPEC one of uniform:LOW:HIGH, loguniform:LOW:HIGH, "
                      "int:LOW:HIGH, logint:LOW:HIGH, choice:A,B,...)");
  };
  auto equals = text.find('=');
  if (equals == std::string_view::npos) throw fail("no '='");
  Param param;
  param.name = std::string(trim(text.substr(0, equals)));
  if (!valid_name(param.name)) throw fail("'" + param.name + "' is not a train flag name (lr, batch ...) or env:VARIABLE");
  std::string_view spec = text.substr(equals + 1);
  auto colon = spec.find(':');
  if (colon == std::string_view::npos) throw fail("no distribution");
  std::string_view kind = spec.substr(0, colon), rest = spec.substr(colon + 1);

  if (kind == "choice") {
    param.distribution = Distribution::choice;
    std::set<std::string> seen;
    size_t start = 0;
    while (true) {
      size_t comma = rest.find(',', start);
      std::string_view item = trim(rest.substr(start, comma == std::string_view::npos ? rest.npos : comma - start));
      if (item.empty() && !param.is_environment()) throw fail("an empty choice");
      if (!seen.insert(std::string(item)).second) throw fail("the choice '" + std::string(item) + "' twice");
      param.choices.push_back(choice_value(item));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    return param;
  }

  if (kind == "uniform") param.distribution = Distribution::uniform;
  else if (kind == "loguniform") param.distribution = Distribution::log_uniform;
  else if (kind == "int") param.distribution = Distribution::integer;
  else if (kind == "logint") param.distribution = Distribution::log_integer;
  else throw fail("unknown distribution '" + std::string(kind) + "'");

  auto second = rest.find(':');
  if (second == std::string_view::npos) throw fail("needs LOW:HIGH");
  std::string_view low_text = rest.substr(0, second), high_text = rest.substr(second + 1);
  if (is_integer(param.distribution)) {
    int64_t low = 0, high = 0;
    if (!parse_number(low_text, low) || !parse_number(high_text, high)) throw fail("bounds must be integers");
    param.low = static_cast<double>(low);
    param.high = static_cast<double>(high);
    if (low > high) throw fail("LOW is above HIGH");
  } else {
    if (!parse_number(low_text, param.low) || !parse_number(high_text, param.high) || !std::isfinite(param.low) ||
        !std::isfinite(param.high))
      throw fail("bounds must be numbers");
    if (param.low >= param.high) throw fail("LOW must be below HIGH");
  }
  if (is_log(param.distribution) && param.low <= 0) throw fail("a log distribution needs LOW > 0");
  return param;
}

SearchSpace parse_space(const std::vector<std::string>& texts) {
  SearchSpace space;
  std::set<std::string> names;
  for (auto& text : texts) {
    Param param = parse_param(text);
    if (!names.insert(param.name).second) throw UsageError("--param: '" + param.name + "' is given twice");
    space.push_back(std::move(param));
  }
  return space;
}

std::string spec_text(const Param& param) {
  std::string out(distribution_name(param.distribution));
  if (param.distribution == Distribution::choice) {
    for (size_t i = 0; i < param.choices.size(); ++i) out += (i ? "," : ":") + value_text(param.choices[i]);
    return out;
  }
  bool integer = is_integer(param.distribution);
  return out + ":" + value_text(integer ? nlohmann::json(std::llround(param.low)) : nlohmann::json(param.low)) + ":" +
         value_text(integer ? nlohmann::json(std::llround(param.high)) : nlohmann::json(param.high));
}

nlohmann::json to_json(const SearchSpace& space) {
  nlohmann::json out = nlohmann::json::array();
  for (auto& param : space) {
    nlohmann::json entry = {{"name", param.name}, {"distribution", distribution_name(param.distribution)}};
    if (param.distribution == Distribution::choice) entry["choices"] = param.choices;
    else {
      entry["low"] = param.low;
      entry["high"] = param.high;
    }
    out.push_back(entry);
  }
  return out;
}

SearchSpace space_from_json(const nlohmann::json& json) {
  SearchSpace space;
  try {
    for (auto& entry : json) {
      Param param;
      param.name = entry.at("name").get<std::string>();
      auto kind = entry.at("distribution").get<std::string>();
      bool known = false;
      for (auto distribution : {Distribution::uniform, Distribution::log_uniform, Distribution::integer,
                                Distribution::log_integer, Distribution::choice})
        if (distribution_name(distribution) == kind) {
          param.distribution = distribution;
          known = true;
        }
      if (!known) throw BadInput("unknown distribution '" + kind + "' in the study");
      if (param.distribution == Distribution::choice) param.choices = entry.at("choices").get<std::vector<nlohmann::json>>();
      else {
        param.low = entry.at("low").get<double>();
        param.high = entry.at("high").get<double>();
      }
      space.push_back(std::move(param));
    }
  } catch (const nlohmann::json::exception& e) {
    throw BadInput(std::string("the study's search space is damaged: ") + e.what());
  }
  return space;
}

std::pair<double, double> internal_bounds(const Param& param) {
  switch (param.distribution) {
    case Distribution::uniform: return {param.low, param.high};
    case Distribution::log_uniform: return {std::log(param.low), std::log(param.high)};
    case Distribution::integer: return {param.low - 0.5, param.high + 0.5};
    case Distribution::log_integer: return {std::log(param.low - 0.5), std::log(param.high + 0.5)};
    case Distribution::choice: return {-0.5, static_cast<double>(param.choices.size()) - 0.5};
  }
  return {0, 0};
}

double to_internal(const Param& param, const nlohmann::json& value) {
  if (param.distribution == Distribution::choice) {
    auto found = std::find(param.choices.begin(), param.choices.end(), value);
    return static_cast<double>(found - param.choices.begin());
  }
  double number = value.get<double>();
  return is_log(param.distribution) ? std::log(number) : number;
}

nlohmann::json from_internal(const Param& param, double internal) {
  if (param.distribution == Distribution::choice) {
    auto index = static_cast<int64_t>(std::llround(internal));
    index = std::clamp<int64_t>(index, 0, static_cast<int64_t>(param.choices.size()) - 1);
    return param.choices[static_cast<size_t>(index)];
  }
  double number = is_log(param.distribution) ? std::exp(internal) : internal;
  number = std::clamp(number, param.low, param.high);
  if (is_integer(param.distribution)) return std::clamp(std::llround(number), std::llround(param.low), std::llround(param.high));
  return number;
}

bool holds(const Param& param, const nlohmann::json& value) {
  if (param.distribution == Distribution::choice)
    return std::find(param.choices.begin(), param.choices.end(), value) != param.choices.end();
  if (!value.is_number() || (is_integer(param.distribution) && !value.is_number_integer())) return false;
  double number = value.get<double>();
  return number >= param.low && number <= param.high;
}

void check_stored_space(const SearchSpace& space, const std::string& study, const std::set<std::string>& allowed) {
  for (const Param& param : space) {
    std::string given = param.name + "=" + spec_text(param);
    try {
      parse_param(given);
    } catch (const UsageError& e) {
      throw BadInput(study + ": the study's search space holds a parameter the command line would refuse: " +
                     e.what());
    }
    if (param.is_environment() && !allowed.count(param.target()))
      throw UsageError(study + ": the study's search space sets " + param.target() +
                       " in the environment of every trial (--param " + given +
                       "); a run that takes the study's settings sets only the variables it is given: add "
                       "--allow-env " + param.target() + " if you trust that setting, or give the whole command");
  }
}

void check_trial_values(const SearchSpace& space, const nlohmann::json& params, const std::string& trial) {
  for (const Param& param : space) {
    const nlohmann::json value = params.contains(param.name) ? params[param.name] : nlohmann::json();
    if (!holds(param, value))
      throw BadInput(trial + " holds " + param.name + "=" + value.dump() + ", outside the study's search space (" +
                     spec_text(param) + ")");
  }
}

std::vector<nlohmann::json> grid_values(const Param& param) {
  if (param.distribution == Distribution::choice) return param.choices;
  if (!is_integer(param.distribution))
    throw UsageError("--sampler grid: '" + param.name + "' is continuous; give its grid as choice:A,B,...");
  if (param.high - param.low >= max_integer_grid)
    throw UsageError("--sampler grid: '" + param.name + "' has too many integers for a grid");
  std::vector<nlohmann::json> values;
  for (auto v = std::llround(param.low); v <= std::llround(param.high); ++v) values.push_back(v);
  return values;
}

std::string value_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) {
    char text[32];
    auto [end, ec] = std::to_chars(text, text + sizeof text, value.get<double>());
    return std::string(text, end);
  }
  return value.dump();
}

}  // namespace tessera::sweep
