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
  // `task` names the work ("train", "tile"...); `total` is the number of units, 0 if unknown;
  // `label` (on a terminal only) names what the bar counts, in place of the task ("tile s1.svs").
  Progress(std::string task, uint64_t total, std::string label = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Advances to `done` units; `fields` are shown beside the bar (loss, tiles/s ...).
  // Throttled: draws at most a few times a second, whatever the call rate.
  void update(uint64_t done, const nlohmann::json& fields = {});
  // An event worth its own line in either mode (an epoch summary, a warning).
  void event(const nlohmann::json& record);
  // The same, with its readable line given: `record` off a terminal (nothing when null), `line` on one.
  void event(const nlohmann::json& record, const std::string& line);
  // Ends the bar.
  void finish();
  // Ends the bar with the record of what it counted (a slide's summary): on a terminal `line`
  // takes the bar's place, otherwise the record follows the last progress line.
  void finish(const nlohmann::json& record, const std::string& line);

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

  std::string task_, label_;
  uint64_t total_, done_ = 0, mark_done_ = 0;  // mark: the units done at the last event
  nlohmann::json fields_;
  bool human_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_, mark_time_;
};

// A record outside any bar (what a command found before its work starts, a run's result): a
// readable line or a JSON line on stderr.
void report(const std::string& task, const nlohmann::json& record);
// The same, with its readable line given: `record` off a terminal (nothing when null), `line` on one.
void report(const std::string& task, const nlohmann::json& record, const std::string& line);

// The readable line of a record: an epoch summary ("epoch 2/10  loss 0.412 ..."), a checkpoint,
// a split, a warning or error, else its fields in order. `seconds_left` (when not negative) ends an epoch line.
std::string render_record(const std::string& task, const nlohmann::json& record, double seconds_left = -1);
// A number for people: integers whole, others to 4 significant digits ("0.4213", "1.2e-05").
std::string format_number(const nlohmann::json& value);
// "45s", "3m05s", "2h10m"; with `tenths`, under 10 s to two significant digits ("0.42s", "3.1s").
std::string format_duration(double seconds, bool tenths = false);

// A column of a table for people: its title, and whether its cells align right (numbers).
struct TableColumn {
  std::string title;
  bool right = false;
};
// The rows under their titles, each column as wide as its widest cell, two spaces apart, no
// trailing spaces; with `total`, the last row (the totals) under a rule.
std::string aligned_table(const std::vector<TableColumn>& columns, const std::vector<std::vector<std::string>>& rows,
                          bool total = false);

}  // namespace tessera
