#include "sweep/train_flags.h"

#include <cctype>

#include "common/error.h"

namespace tessera::sweep {

namespace {

// "--lr" of "--lr=0.1"; empty for a token that is not a flag (a value, or a negative number).
std::string flag_name(std::string_view token) {
  if (token.size() < 2 || token.front() != '-') return {};
  if (std::isdigit(static_cast<unsigned char>(token[1])) || token[1] == '.') return {};
  if (token == "--") return {};
  return std::string(token.substr(0, token.find('=')));
}

}  // namespace

void check_train_flags(const TrainFlags& known, const std::vector<std::string>& fixed, const SearchSpace& space,
                       bool sweep_sets_device, int trials) {
  std::set<std::string> fixed_names;
  for (auto& token : fixed) {
    std::string name = flag_name(token);
    if (name.empty()) continue;
    if (!known.names.contains(name))
      throw UsageError("train flags after --: 'tessera train' has no flag " + name + " (see tessera train --help)");
    fixed_names.insert(name);
  }
  for (auto& param : space) {
    if (param.is_environment()) continue;
    if (!known.names.contains(param.target()))
      throw UsageError("--param " + param.name + ": 'tessera train' has no flag " + param.target() +
                       " (see tessera train --help)");
    if (fixed_names.contains(param.target()))
      throw UsageError("--param " + param.name + ": " + param.target() + " is also among the fixed train flags");
  }
  if (fixed_names.contains("--report-fd"))
    throw UsageError("train flags after --: --report-fd is set by the sweep");
  if (sweep_sets_device && fixed_names.contains("--device"))
    throw UsageError("--devices: the sweep sets --device; remove it from the train flags");
  for (auto& param : space)
    if (param.name == "report-fd" || (sweep_sets_device && param.name == "device"))
      throw UsageError("--param " + param.name + ": set by the sweep");
  auto checkpoint = flag_value(fixed, "--checkpoint");
  if (checkpoint && trials > 1 && checkpoint->find("{trial}") == std::string::npos)
    throw UsageError("train flags after --: every trial would write --checkpoint " + *checkpoint +
                     "; put {trial} in it for one checkpoint per trial (e.g. runs/{trial}.h5)");
}

std::vector<std::string> with_trial_number(std::vector<std::string> tokens, int number) {
  const std::string placeholder = "{trial}", text = std::to_string(number);
  for (auto& token : tokens)
    for (size_t at = token.find(placeholder); at != std::string::npos; at = token.find(placeholder, at + text.size()))
      token.replace(at, placeholder.size(), text);
  return tokens;
}

std::optional<std::string> flag_value(const std::vector<std::string>& tokens, std::string_view flag) {
  std::optional<std::string> value;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == flag && i + 1 < tokens.size()) value = tokens[i + 1];
    else if (tokens[i].starts_with(std::string(flag) + "=")) value = tokens[i].substr(flag.size() + 1);
  }
  return value;
}

void set_flag(std::vector<std::string>& tokens, std::string_view flag, const std::string& value) {
  bool found = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == flag && i + 1 < tokens.size()) {
      tokens[i + 1] = value;
      found = true;
    } else if (tokens[i].starts_with(std::string(flag) + "=")) {
      tokens[i] = std::string(flag) + "=" + value;
      found = true;
    }
  }
  if (!found) {
    tokens.emplace_back(flag);
    tokens.push_back(value);
  }
}

}  // namespace tessera::sweep
