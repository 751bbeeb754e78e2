#include "common/library_warnings.h"

#include <cstdio>
#include <map>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "common/progress.h"
#include "common/utf8.h"

namespace tessera {

namespace {

// Distinct warnings kept with their counts; past these, a message is still told once but not counted.
constexpr size_t most_kept = 256;
// Files named for a repeated warning's count; past these, counted only.
constexpr size_t most_files = 1024;

struct Seen {
  std::string library, message, first_file;
  uint64_t count = 0;
  std::set<std::string> files;
};

struct Warnings {
  std::mutex mutex;
  std::string task = "tessera";
  bool dropped = false;
  std::map<std::pair<std::string, std::string>, Seen> seen;  // by library and message
};

Warnings& warnings() {
  static Warnings* all = new Warnings;  // never destroyed: libraries may report from exit handlers
  return *all;
}

thread_local const std::string* current_file = nullptr;

// The file of the scope entered last on any thread: what a library's own worker threads (libvips'
// thread pool) are most likely working on, since tessera reads the slides one at a time.
struct LatestFile {
  std::mutex mutex;
  std::string path;
};
LatestFile& latest_file() {
  static LatestFile* latest = new LatestFile;  // never destroyed, as warnings()
  return *latest;
}

// One warning line: readable on a terminal (the bar, if one is drawn, is erased first and redrawn
// by its next update), else a JSON line.
void tell(const std::string& task, const Seen& seen, uint64_t repeats) {
  std::string text = (seen.first_file.empty() ? "" : seen.first_file + ": ") + seen.library + ": " + seen.message;
  std::fflush(stdout);
  if (Progress::human()) {
    std::string more = repeats > 1 ? " (" + std::to_string(repeats) + " times in all, in " +
                                         std::to_string(seen.files.size()) + " file" +
                                         (seen.files.size() == 1 ? "" : "s") + ")"
                                   : "";
    std::fprintf(stderr, "\r\033[K%s warning: %s%s\n", task.c_str(), text.c_str(), more.c_str());
    return;
  }
  nlohmann::json line = {{"task", task}, {"warning", text}, {"file", seen.first_file}, {"library", seen.library}};
  if (repeats > 1) line.update({{"repeats", repeats}, {"files", seen.files.size()}});
  std::fprintf(stderr, "%s\n", line.dump().c_str());
}

}  // namespace

void set_library_warning_task(const std::string& task) {
  std::lock_guard lock(warnings().mutex);
  warnings().task = task;
}

void library_warning(const std::string& library, const std::string& file, const std::string& message) {
  Warnings& all = warnings();
  std::string text = valid_utf8(message);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::lock_guard lock(all.mutex);
  if (all.dropped) return;
  auto key = std::make_pair(library, text);
  auto found = all.seen.find(key);
  if (found != all.seen.end()) {
    ++found->second.count;
    if (found->second.files.size() < most_files) found->second.files.insert(file);
    return;
  }
  Seen seen{library, text, valid_utf8(file), 1, {file}};
  tell(all.task, seen, 1);
  if (all.seen.size() < most_kept) all.seen.emplace(std::move(key), std::move(seen));
}

void report_repeated_library_warnings() {
  Warnings& all = warnings();
  std::lock_guard lock(all.mutex);
  for (auto& [key, seen] : all.seen)
    if (seen.files.size() > 1) tell(all.task, seen, seen.count);  // the same file again is no news
  all.seen.clear();
}

void drop_library_warnings() {
  std::lock_guard lock(warnings().mutex);
  warnings().dropped = true;
}

LibraryFileScope::LibraryFileScope(const std::string& path) : previous_(current_file) {
  current_file = &path;
  std::lock_guard lock(latest_file().mutex);
  latest_file().path = path;
}

LibraryFileScope::~LibraryFileScope() { current_file = previous_; }

std::string library_file() {
  if (current_file) return *current_file;
  std::lock_guard lock(latest_file().mutex);
  return latest_file().path;
}

}  // namespace tessera
