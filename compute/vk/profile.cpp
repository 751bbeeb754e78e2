#include "compute/vk/profile.h"

#include <algorithm>

namespace tessera::vk {

void Profile::add(const std::string& name, double seconds) {
  auto& entry = entries_[name];
  entry.name = name;
  ++entry.commands;
  entry.seconds += seconds;
}

std::vector<ProfileEntry> Profile::entries() const {
  std::vector<ProfileEntry> sorted;
  for (auto& [name, entry] : entries_) sorted.push_back(entry);
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.seconds > b.seconds; });
  return sorted;
}

double Profile::total_seconds() const {
  double total = 0;
  for (auto& [name, entry] : entries_) total += entry.seconds;
  return total;
}

nlohmann::json Profile::report(const std::string& device) const {
  double total = total_seconds();
  nlohmann::json kernels = nlohmann::json::array();
  for (auto& entry : entries())
    kernels.push_back({{"name", entry.name},
                       {"commands", entry.commands},
                       {"seconds", entry.seconds},
                       {"share", total > 0 ? entry.seconds / total : 0.0}});
  return {{"event", "profile"}, {"device", device}, {"seconds", total}, {"kernels", kernels}};
}

}  // namespace tessera::vk
