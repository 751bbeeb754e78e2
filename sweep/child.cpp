#include "sweep/child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "common/error.h"

extern char** environ;

namespace tessera::sweep {

namespace {

// Descriptors the child's ends are moved to before the fork, above anything dup2 targets, so
// that dup2 onto 0-3 never overwrites an end not yet moved.
constexpr int high_descriptor = 10;

[[noreturn]] void system_error(const std::string& what) {
  throw Error(ExitCode::runtime_error, what + ": " + std::strerror(errno));
}

struct Pipe {
  int read = -1, write = -1;
};

Pipe make_pipe() {
  int ends[2];
  if (pipe2(ends, O_CLOEXEC) != 0) system_error("pipe");
  int moved = fcntl(ends[1], F_DUPFD_CLOEXEC, high_descriptor);
  close(ends[1]);
  if (moved < 0) system_error("fcntl");
  fcntl(ends[0], F_SETFL, O_NONBLOCK);
  return {ends[0], moved};
}

// Reads everything available without blocking; closes and sets `fd` to -1 at end of file.
void drain(int& fd, std::string& into) {
  char buffer[65536];
  while (fd >= 0) {
    ssize_t count = read(fd, buffer, sizeof buffer);
    if (count > 0) into.append(buffer, static_cast<size_t>(count));
    else if (count == 0) {
      close(fd);
      fd = -1;
    } else if (errno == EINTR) continue;
    else if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    else {
      close(fd);
      fd = -1;
    }
  }
}

std::vector<std::string> environment_with(const Environment& changes) {
  std::vector<std::string> entries;
  for (char** entry = environ; *entry; ++entry) {
    std::string_view text(*entry);
    bool replaced = false;
    for (auto& [name, value] : changes) replaced = replaced || (text.starts_with(name) && text.size() > name.size() && text[name.size()] == '=');
    if (!replaced) entries.emplace_back(text);
  }
  for (auto& [name, value] : changes)
    if (!value.empty()) entries.push_back(name + "=" + value);
  return entries;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& command, const Environment& environment, Output output) {
  if (command.empty()) throw Error(ExitCode::runtime_error, "no command to run");
  std::vector<std::string> arguments = command, variables = environment_with(environment);
  auto argv = pointers(arguments), envp = pointers(variables);
  Pipe report = make_pipe(), errors = make_pipe();
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    // Only async-signal-safe calls from here on.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(null, STDIN_FILENO);
    dup2(output == Output::report ? report.write : null, STDOUT_FILENO);
    dup2(errors.write, STDERR_FILENO);
    dup2(report.write, report_descriptor);
    execve(argv[0], argv.data(), envp.data());
    const char message[] = "tessera sweep: cannot run the trial command\n";
    (void)!write(STDERR_FILENO, message, sizeof message - 1);
    _exit(127);
  }
  int fork_errno = errno;
  close(null);
  close(report.write);
  close(errors.write);
  if (pid_ < 0) {
    close(report.read);
    close(errors.read);
    errno = fork_errno;
    system_error("fork");
  }
  report_fd_ = report.read;
  stderr_fd_ = errors.read;
}

ChildProcess::~ChildProcess() {
  if (report_fd_ >= 0) close(report_fd_);
  if (stderr_fd_ >= 0) close(stderr_fd_);
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &wait_status_, 0);
  }
}

std::vector<std::string> ChildProcess::read_report() {
  drain(report_fd_, report_buffer_);
  std::vector<std::string> lines;
  size_t start = 0, newline;
  while ((newline = report_buffer_.find('\n', start)) != std::string::npos) {
    lines.push_back(report_buffer_.substr(start, newline - start));
    start = newline + 1;
  }
  report_buffer_.erase(0, start);
  // A last line without its newline counts once the child has closed the pipe.
  if (report_fd_ < 0 && !report_buffer_.empty()) lines.push_back(std::exchange(report_buffer_, {}));
  return lines;
}

void ChildProcess::read_stderr() {
  drain(stderr_fd_, stderr_tail_);
  if (stderr_tail_.size() > stderr_tail_bytes) stderr_tail_.erase(0, stderr_tail_.size() - stderr_tail_bytes);
}

void ChildProcess::send(int signal) const {
  if (!reaped_) kill(pid_, signal);
}

bool ChildProcess::try_reap() {
  if (reaped_) return true;
  pid_t result = waitpid(pid_, &wait_status_, WNOHANG);
  reaped_ = result == pid_;
  return reaped_;
}

void ChildProcess::wait() {
  while (!reaped_) {
    pid_t result = waitpid(pid_, &wait_status_, 0);
    if (result == pid_) reaped_ = true;
    else if (result < 0 && errno != EINTR) system_error("waitpid");
  }
}

CapturedRun run_captured(const std::vector<std::string>& command, const Environment& environment) {
  ChildProcess child(command, environment, ChildProcess::Output::report);
  CapturedRun run;
  while (child.report_fd() >= 0 || child.stderr_fd() >= 0) {
    pollfd fds[2] = {{child.report_fd(), POLLIN, 0}, {child.stderr_fd(), POLLIN, 0}};
    poll(fds, 2, -1);
    for (auto& line : child.read_report()) run.output += line + "\n";
    child.read_stderr();
  }
  child.wait();
  run.wait_status = child.wait_status();
  run.errors = child.stderr_tail();
  return run;
}

uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return pages_resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace tessera::sweep
