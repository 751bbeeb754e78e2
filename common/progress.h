// Progress of long work: a bar on a terminal, one JSON object per line otherwise.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera {

class Progress {
 public:
  // `task` names the work ("train", "tile"...); `total` is the number of units, 0 if unknown.
  Progress(std::string task, uint64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Advances to `done` units; `fields` are shown beside the bar (loss, tiles/s ...).
  // Throttled: draws at most a few times a second, whatever the call rate.
  void update(uint64_t done, const nlohmann::json& fields = {});
  // An event worth its own line in either mode (an epoch summary, a warning).
  void event(const nlohmann::json& record);
  // Ends the bar.
  void finish();
  // An event of `task` outside any bar (what a command found before its work starts).
  static void note(const std::string& task, const nlohmann::json& record);

  static bool stderr_is_terminal();

 private:
  void draw(bool force);

  std::string task_;
  uint64_t total_, done_ = 0;
  nlohmann::json fields_;
  bool terminal_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace tessera
