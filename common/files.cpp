#include "common/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace tessera {

namespace {

void sync(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw Error(ExitCode::runtime_error, path + ": cannot open to sync: " + std::strerror(errno));
  int result = ::fsync(fd);
  int error = errno;
  ::close(fd);
  if (result != 0)
    throw Error(ExitCode::runtime_error, path + ": cannot sync to disk: " + std::strerror(error) + disk_full_hint());
}

}  // namespace

std::string disk_full_hint() { return " (is the disk full? free some space and run the command again)"; }

void durable_rename(const std::string& from, const std::string& to) {
  sync(from, O_RDONLY);
  std::error_code error;
  std::filesystem::rename(from, to, error);
  if (error) throw Error(ExitCode::runtime_error, "cannot rename " + from + " to " + to + ": " + error.message());
  auto directory = std::filesystem::absolute(to).parent_path();
  sync(directory.string(), O_RDONLY | O_DIRECTORY);
}

bool durable_link_new(const std::string& from, const std::string& to) {
  sync(from, O_RDONLY);
  if (::link(from.c_str(), to.c_str()) != 0) {
    int error = errno;
    if (error == EEXIST) return false;
    throw Error(ExitCode::runtime_error, "cannot link " + from + " at " + to + ": " + std::strerror(error));
  }
  ::unlink(from.c_str());
  sync(std::filesystem::absolute(to).parent_path().string(), O_RDONLY | O_DIRECTORY);
  return true;
}

std::string lowercase_extension(const std::string& path) {
  std::string extension = std::filesystem::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(), [](unsigned char c) { return std::tolower(c); });
  return extension;
}

}  // namespace tessera
