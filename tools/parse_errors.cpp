#include "tools/parse_errors.h"

#include <algorithm>
#include <vector>

namespace tessera::cli {

namespace {

// Edits (insertions, deletions, substitutions, adjacent swaps) between two words.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The candidate nearest to `typed`, if near enough to be what was meant ("" if none is).
std::string nearest(const std::string& typed, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, (typed.size() + 1) / 2) + 1;
  for (const std::string& candidate : candidates)
    if (size_t distance = edit_distance(typed, candidate); distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  return best;
}

// The commands the line chose: the app, then each subcommand within the last.
std::vector<const CLI::App*> chosen(const CLI::App& app) {
  std::vector<const CLI::App*> chain{&app};
  while (!chain.back()->get_subcommands().empty()) chain.push_back(chain.back()->get_subcommands().front());
  return chain;
}

std::vector<std::string> flag_names(const std::vector<const CLI::App*>& chain) {
  std::vector<std::string> names;
  for (const CLI::App* command : chain)
    for (const CLI::Option* option : command->get_options()) {
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
      for (const std::string& name : option->get_snames()) names.push_back("-" + name);
    }
  return names;
}

}  // namespace

std::string explain_parse_error(const CLI::App& app, const CLI::ParseError& error) {
  auto chain = chosen(app);
  std::string command = chain.size() == 1 && app.get_parent() == nullptr && app.get_subcommands({}).size()
                            ? "tessera"
                            : "tessera " + chain.back()->get_name();
  std::string help = " (`" + command + " --help` lists them)";
  if (dynamic_cast<const CLI::ExtrasError*>(&error)) {
    std::vector<std::string> extras;
    for (const CLI::App* part : chain)
      for (const std::string& extra : part->remaining(false))
        if (std::find(extras.begin(), extras.end(), extra) == extras.end()) extras.push_back(extra);
    std::string message;
    for (const std::string& extra : extras) {
      if (extra.size() < 2 || extra[0] != '-') continue;
      std::string flag = extra.substr(0, extra.find('='));
      std::string guess = nearest(flag, flag_names(chain));
      message += (message.empty() ? "" : "; ") + flag + " is not a flag of " + command +
                 (guess.empty() ? "" : ": did you mean " + guess + "?");
    }
    if (!message.empty()) return command + ": " + message + help;
  }
  if (command == "tessera") {  // no command chosen: a misspelt one, or a misspelt flag?
    auto extras = app.remaining(false);
    if (!extras.empty() && extras.front().size() > 1 && extras.front()[0] == '-') {
      std::string guess = nearest(extras.front(), flag_names(chain));
      return "tessera: " + extras.front() + " is not a flag" + (guess.empty() ? "" : ": did you mean " + guess + "?") +
             " (`tessera --help` lists them)";
    }
    auto word = std::find_if(extras.begin(), extras.end(), [](const std::string& e) { return e.empty() || e[0] != '-'; });
    if (word != extras.end()) {
      std::vector<std::string> names;
      for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
      std::string guess = nearest(*word, names);
      return "tessera: " + *word + " is not a command" + (guess.empty() ? "" : ": did you mean " + guess + "?") +
             " (`tessera --help` lists them)";
    }
  }
  return command + ": " + error.what();
}

}  // namespace tessera::cli
