#include "common/progress.h"

#include <unistd.h>

#include <cstdio>

namespace tessera {

using Clock = std::chrono::steady_clock;

Progress::Progress(std::string task, uint64_t total)
    : task_(std::move(task)), total_(total), terminal_(stderr_is_terminal()), start_(Clock::now()) {}

Progress::~Progress() { finish(); }

bool Progress::stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

void Progress::update(uint64_t done, const nlohmann::json& fields) {
  done_ = done;
  if (!fields.is_null()) fields_ = fields;
  draw(false);
}

void Progress::event(const nlohmann::json& record) {
  if (terminal_) std::fputs("\r\033[K", stderr);
  nlohmann::json line = {{"task", task_}};
  line.update(record);
  std::fprintf(stderr, "%s\n", line.dump().c_str());
  if (terminal_ && !finished_) draw(true);
}

void Progress::note(const std::string& task, const nlohmann::json& record) {
  nlohmann::json line = {{"task", task}};
  line.update(record);
  std::fprintf(stderr, "%s\n", line.dump().c_str());
}

void Progress::finish() {
  if (finished_) return;
  draw(true);
  if (terminal_) std::fputc('\n', stderr);
  finished_ = true;
}

void Progress::draw(bool force) {
  auto now = Clock::now();
  auto interval = terminal_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(2000);
  if (!force && now - last_draw_ < interval) return;
  last_draw_ = now;
  double seconds = std::chrono::duration<double>(now - start_).count();
  if (!terminal_) {
    nlohmann::json line = {{"task", task_}, {"done", done_}, {"elapsed_s", seconds}};
    if (total_) line["total"] = total_;
    if (fields_.is_object()) line.update(fields_);
    std::fprintf(stderr, "%s\n", line.dump().c_str());
    return;
  }
  std::string bar;
  if (total_) {
    const int width = 30;
    int filled = static_cast<int>(width * static_cast<double>(done_) / static_cast<double>(total_));
    bar = "[" + std::string(static_cast<size_t>(filled), '#') +
          std::string(static_cast<size_t>(width - filled), ' ') + "] ";
  }
  std::string extra;
  if (fields_.is_object())
    for (auto& [key, value] : fields_.items())
      extra += " " + key + "=" + (value.is_number_float() ? std::to_string(value.get<double>()) : value.dump());
  std::string count = std::to_string(done_) + (total_ ? "/" + std::to_string(total_) : "");
  std::fprintf(stderr, "\r\033[K%s %s%s %.1fs%s", task_.c_str(), bar.c_str(), count.c_str(), seconds, extra.c_str());
  std::fflush(stderr);
}

}  // namespace tessera
