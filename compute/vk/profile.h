// Device time per kernel, from timestamps that a profiled Program writes after every command.
// On devices that overlap independent dispatches the split between them is approximate; the
// total is exact.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::vk {

struct ProfileEntry {
  std::string name;  // "<scope> <kernel>", e.g. "conv2 conv2d_backward_data"
  uint64_t commands = 0;
  double seconds = 0;
};

class Profile {
 public:
  void add(const std::string& name, double seconds);
  // Entries by time, longest first.
  std::vector<ProfileEntry> entries() const;
  double total_seconds() const;
  // {"event":"profile","device":...,"seconds":...,"kernels":[{name,commands,seconds,share}...]}
  nlohmann::json report(const std::string& device) const;

 private:
  std::map<std::string, ProfileEntry> entries_;
};

}  // namespace tessera::vk
