// Progress of long work for people and for programs: on a terminal, a bar and one readable line
// per event; otherwise (or with --json) one JSON object per line, the record itself.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

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

  // --json: JSON lines even on a terminal (set before any Progress exists).
  static void set_json(bool json);
  static bool json();
  // Whether people read stderr: a terminal, and no --json.
  static bool human();
  // Whether people read file descriptor `fd` (stdout for a command's result): as human().
  static bool human(int fd);

 private:
  void draw(bool force);
  double seconds_left() const;  // negative while unknown

  std::string task_;
  uint64_t total_, done_ = 0, mark_done_ = 0;  // mark: the units done at the last event
  nlohmann::json fields_;
  bool human_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_, mark_time_;
};

// A record outside any bar (what a command found before its work starts, a run's result): a
// readable line or a JSON line on stderr.
void report(const std::string& task, const nlohmann::json& record);

// The readable line of a record: an epoch summary ("epoch 2/10  loss 0.412 ..."), a checkpoint,
// a split, a warning or error, else its fields in order. `seconds_left` (when not negative) ends an epoch line.
std::string render_record(const std::string& task, const nlohmann::json& record, double seconds_left = -1);
// A number for people: integers whole, others to 4 significant digits ("0.4213", "1.2e-05").
std::string format_number(const nlohmann::json& value);
// "45s", "3m05s", "2h10m".
std::string format_duration(double seconds);
// Rows of cells as lines of aligned columns two spaces apart, each line ending in "\n" without
// trailing spaces; the columns `right` marks are aligned to the right (numbers). Cells are
// measured in bytes: names that are not ASCII align only roughly.
std::string format_columns(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right = {});

}  // namespace tessera
