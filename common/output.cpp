#include "common/output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "common/error.h"
#include "common/files.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int error) { return std::strerror(error); }

// The output's own name, for a path given with a trailing slash too ("out/" -> "out").
fs::path output_path(const std::string& output) {
  fs::path path = fs::path(output).lexically_normal();
  if (!path.has_filename() && path.has_parent_path()) path = path.parent_path();
  return path;
}

std::string lock_path_of(const std::string& output) {
  fs::path path = output_path(output);
  return (path.parent_path() / ("." + path.filename().string() + ".lock")).string();
}

// "pid 123 on host, since 2024-05-01 10:00:00: tessera train --checkpoint c.h5".
std::string this_run() {
  std::time_t now = std::time(nullptr);
  char since[32] = {};
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S", &local);
  std::string command;
  for (const std::string& argument : process_arguments()) command += (command.empty() ? "" : " ") + argument;
  if (command.size() > 300) {  // in place: GCC 12 sees a false overflow in substr(0, 300) + "..."
    command.resize(300);
    command += "...";
  }
  return "pid " + std::to_string(getpid()) + " on " + host_name() + ", since " + since + ": " + command;
}

std::string read_holder(int fd) {
  std::string text(1024, '\0');
  ssize_t count = pread(fd, text.data(), text.size(), 0);
  text.resize(count > 0 ? static_cast<size_t>(count) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text.empty() ? "another tessera run" : text;
}

}  // namespace

std::vector<std::string> process_arguments() {
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::string text(std::istreambuf_iterator<char>(cmdline), {});
  std::vector<std::string> arguments;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    arguments.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return arguments;
}

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

OutputLock::OutputLock(const std::string& output) {
  std::string holder;
  if (!acquire(output, &holder))
    throw OutputInUse(output + ": in use by another tessera run (" + holder +
                      "); wait for it to end, or write to another path");
}

std::optional<OutputLock> OutputLock::try_lock(const std::string& output, std::string* holder) {
  OutputLock lock;
  if (!lock.acquire(output, holder)) return std::nullopt;
  return lock;
}

bool OutputLock::acquire(const std::string& output, std::string* holder) {
  output_ = output;
  lock_path_ = lock_path_of(output);
  // A run that ends removes its lock file; one that opened it just before then finds the name
  // gone or new once it holds the lock, and opens it again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      int error = errno;
      std::string directory = output_path(output).parent_path().string();
      if (error == ELOOP)
        throw Error(ExitCode::runtime_error, lock_path_ + ": a link where the lock of " + output +
                                                 " goes; tessera never writes through links: remove it");
      throw Error(ExitCode::runtime_error, output + ": cannot write in " + (directory.empty() ? "." : directory) +
                                               " (creating " + lock_path_ + ": " + errno_text(error) + ")");
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int error = errno;
      if (holder) *holder = read_holder(fd);
      ::close(fd);
      if (error == EWOULDBLOCK) return false;
      throw Error(ExitCode::runtime_error, lock_path_ + ": cannot lock: " + errno_text(error));
    }
    if (!names_file(lock_path_, fd)) {
      ::close(fd);
      continue;
    }
    std::string record = this_run() + "\n";
    if (ftruncate(fd, 0) != 0 || pwrite(fd, record.data(), record.size(), 0) < 0) {
      int error = errno;
      ::unlink(lock_path_.c_str());
      ::close(fd);
      throw Error(ExitCode::runtime_error,
                  output + ": cannot write the lock " + lock_path_ + ": " + errno_text(error) + disk_full_hint());
    }
    fd_ = fd;
    return true;
  }
  throw Error(ExitCode::runtime_error, lock_path_ + ": the lock file keeps changing; is another run starting?");
}

void OutputLock::release() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

OutputLock::~OutputLock() { release(); }

OutputLock::OutputLock(OutputLock&& other) noexcept
    : output_(std::move(other.output_)), lock_path_(std::move(other.lock_path_)), fd_(std::exchange(other.fd_, -1)) {}

OutputLock& OutputLock::operator=(OutputLock&& other) noexcept {
  if (this != &other) {
    release();
    output_ = std::move(other.output_);
    lock_path_ = std::move(other.lock_path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

bool output_exists(const std::string& path) {
  struct stat status {};
  return lstat(output_path(path).c_str(), &status) == 0;
}

void check_replaceable(const std::string& path, const std::string& flag, Existing existing,
                       const std::string& remedy) {
  if (existing != Existing::refuse || !output_exists(path)) return;
  std::error_code error;
  bool link = fs::is_symlink(output_path(path), error);
  throw UsageError(flag + " " + path + ": already exists" + (link ? " (a link)" : "") +
                   " and would be replaced; " + remedy);
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

int UniqueFd::release() { return std::exchange(fd_, -1); }

UniqueFd create_new_file(const std::string& path) {
  // unlink removes a link itself, never what it points to.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    int error = errno;
    throw Error(ExitCode::runtime_error, path + ": cannot remove the leftover temporary: " + errno_text(error));
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    int error = errno;
    throw Error(ExitCode::runtime_error, path + ": cannot create: " + errno_text(error) +
                                             (error == ENOSPC || error == EDQUOT ? disk_full_hint() : ""));
  }
  return UniqueFd(fd);
}

bool is_plain_file(const std::string& path) {
  struct stat status {};
  return lstat(path.c_str(), &status) == 0 && S_ISREG(status.st_mode);
}

bool names_file(const std::string& path, int fd) {
  struct stat opened {}, named {};
  return fstat(fd, &opened) == 0 && lstat(path.c_str(), &named) == 0 && S_ISREG(named.st_mode) &&
         opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
}

void write_new_file(const std::string& path, const std::string& text) {
  UniqueFd file = create_new_file(path);
  for (size_t written = 0; written < text.size();) {
    ssize_t count = ::write(file.get(), text.data() + written, text.size() - written);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw Error(ExitCode::runtime_error, path + ": cannot write: " + errno_text(errno) + disk_full_hint());
    written += static_cast<size_t>(count);
  }
}

void write_file_replacing(const std::string& path, const std::string& text) {
  std::string partial = path + ".partial";
  try {
    write_new_file(partial, text);
    durable_rename(partial, path);
  } catch (...) {
    ::unlink(partial.c_str());
    throw;
  }
}

void write_output_file(const std::string& path, const std::string& text, const std::string& flag, bool overwrite) {
  OutputLock lock(path);
  check_replaceable(path, flag, overwrite ? Existing::overwrite : Existing::refuse);
  write_file_replacing(path, text);
}

}  // namespace tessera
