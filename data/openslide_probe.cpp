// OpenSlide tried in a child process first: a file that makes it crash (OpenSlide 3.4.1 divides by
// zero on an SVS whose levels' tile grids do not nest, and aborts when a tile is too large to
// allocate) ends the child, not tessera, and becomes an error naming the file.
#include <fcntl.h>
#include <openslide/openslide.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/library_warnings.h"
#include "data/slide_parts.h"

namespace tessera::data {

namespace {

[[noreturn]] void finish_child(int report, int code, const std::string& message) {
  if (!message.empty()) {
    ssize_t ignored = ::write(report, message.data(), message.size());
    (void)ignored;
  }
  ::_exit(code);
}

// In the child: open the slide and read a small region of every level at its origin and its
// centre (the paths a tile read takes); what went wrong is written to `report`.
[[noreturn]] void probe_in_child(const std::string& path, int report) {
  auto finish = [report](int code, const std::string& message) { finish_child(report, code, message); };
  drop_library_warnings();  // the parent opens the slide again, and tells what OpenSlide says then
  openslide_t* slide = openslide_open(path.c_str());
  if (!slide) finish(3, "not a slide that OpenSlide, libtiff or libvips can read");
  if (const char* error = openslide_get_error(slide)) finish(4, error);
  constexpr int64_t side = 64;
  std::vector<uint32_t> pixels(side * side);
  for (int32_t level = 0; level < openslide_get_level_count(slide); ++level) {
    int64_t width = 0, height = 0;
    openslide_get_level_dimensions(slide, level, &width, &height);
    double downsample = openslide_get_level_downsample(slide, level);
    for (int64_t at : {int64_t{0}, int64_t{1}}) {
      auto x = level0_position(at * std::max<int64_t>(0, width / 2 - side / 2), downsample);
      auto y = level0_position(at * std::max<int64_t>(0, height / 2 - side / 2), downsample);
      openslide_read_region(slide, pixels.data(), x, y, level, side, side);
    }
    if (const char* error = openslide_get_error(slide))
      finish(4, "level " + std::to_string(level) + ": " + error);
  }
  finish_child(report, 0, "");
}

}  // namespace

void probe_openslide(const std::string& path) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0)
    throw Error(ExitCode::runtime_error, path + ": cannot start OpenSlide's probe: " + std::strerror(errno));
  pid_t child = ::fork();
  if (child < 0) {
    ::close(ends[0]);
    ::close(ends[1]);
    throw Error(ExitCode::runtime_error, path + ": cannot start OpenSlide's probe: " + std::strerror(errno));
  }
  if (child == 0) {
    ::close(ends[0]);
    probe_in_child(path, ends[1]);
  }
  ::close(ends[1]);
  std::string message;
  char buffer[512];
  for (ssize_t got; (got = ::read(ends[0], buffer, sizeof buffer)) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    message.append(buffer, static_cast<size_t>(got));
  }
  ::close(ends[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    throw BadInput(path + ": OpenSlide crashed reading it (" + strsignal(WTERMSIG(status)) +
                   "): a corrupt file, or one OpenSlide cannot read");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw BadInput(path + ": " + (WEXITSTATUS(status) == 3 ? message : "OpenSlide: " + message));
}

}  // namespace tessera::data
