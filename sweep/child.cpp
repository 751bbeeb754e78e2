#include "sweep/child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string_view>

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

// What one call reads from a pipe at most: a child that writes without end cannot keep the
// sweep from its other children.
constexpr size_t read_budget = size_t{4} << 20;

// Reads what is available without blocking, up to `budget` bytes, handing each chunk to `take`;
// closes and sets `fd` to -1 at end of file.
template <class Take>
void drain(int& fd, size_t budget, Take&& take) {
  char buffer[65536];
  while (fd >= 0 && budget > 0) {
    ssize_t count = read(fd, buffer, std::min(sizeof buffer, budget));
    if (count > 0) {
      budget -= static_cast<size_t>(count);
      take(std::string_view(buffer, static_cast<size_t>(count)));
    } else if (count == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
      close(fd);
      fd = -1;
    } else if (errno != EINTR) {
      return;
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
    setpgid(0, 0);
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
  setpgid(pid_, pid_);  // as the child does: whichever runs first, signals reach the group
  report_fd_ = report.read;
  stderr_fd_ = errors.read;
  exit_fd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
}

ChildProcess::~ChildProcess() {
  for (int fd : {report_fd_, stderr_fd_, exit_fd_})
    if (fd >= 0) close(fd);
  // The group outlives its leader while a member lives, so its id is not reused meanwhile.
  if (!group_killed_) kill(-pid_, SIGKILL);
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &wait_status_, 0);
  }
}

void ChildProcess::take_lines(std::vector<std::string>& lines) {
  std::string_view chunk(report_buffer_);
  std::string pending;
  while (!chunk.empty()) {
    size_t newline = chunk.find('\n');
    if (skipping_line_) {
      if (newline == std::string_view::npos) break;
      skipping_line_ = false;
      ++report_lines_;
      chunk.remove_prefix(newline + 1);
      continue;
    }
    std::string_view part = chunk.substr(0, newline);
    if (pending.size() + part.size() > max_report_line) {
      if (protocol_errors_.size() < 1024)
        protocol_errors_ += "tessera sweep: report line " + std::to_string(report_lines_ + 1) +
                            " is longer than " + std::to_string(max_report_line) +
                            " bytes: a protocol error, skipped\n";
      pending.clear();
      if (newline == std::string_view::npos) {
        skipping_line_ = true;
        break;
      }
      ++report_lines_;
      chunk.remove_prefix(newline + 1);
      continue;
    }
    pending.append(part);
    if (newline == std::string_view::npos) break;
    lines.push_back(std::move(pending));
    pending.clear();
    ++report_lines_;
    chunk.remove_prefix(newline + 1);
  }
  report_buffer_ = std::move(pending);
}

std::vector<std::string> ChildProcess::read_report() {
  std::vector<std::string> lines;
  drain(report_fd_, read_budget, [&](std::string_view chunk) {
    report_buffer_.append(chunk);
    take_lines(lines);
  });
  // A last line without its newline counts once the child has closed the pipe.
  if (report_fd_ < 0 && !report_buffer_.empty() && !skipping_line_) lines.push_back(std::exchange(report_buffer_, {}));
  return lines;
}

void ChildProcess::read_stderr() {
  drain(stderr_fd_, read_budget, [&](std::string_view chunk) {
    stderr_tail_.append(chunk);
    if (stderr_tail_.size() > stderr_tail_bytes) stderr_tail_.erase(0, stderr_tail_.size() - stderr_tail_bytes);
  });
}

void ChildProcess::send(int signal) const {
  if (kill(-pid_, signal) != 0 && !reaped_) kill(pid_, signal);
}

bool ChildProcess::try_reap() {
  if (reaped_) return true;
  pid_t result = waitpid(pid_, &wait_status_, WNOHANG);
  reaped_ = result == pid_;
  return reaped_;
}

std::vector<std::string> ChildProcess::finish_output() {
  kill(-pid_, SIGKILL);
  group_killed_ = true;
  // What the child wrote before it exited is in the pipes; a process that left the group and
  // writes on is cut off after one bounded read.
  std::vector<std::string> lines = read_report();
  read_stderr();
  for (int* fd : {&report_fd_, &stderr_fd_})
    if (*fd >= 0) close(std::exchange(*fd, -1));
  if (!report_buffer_.empty() && !skipping_line_) lines.push_back(std::exchange(report_buffer_, {}));
  return lines;
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
  while (!child.try_reap()) {
    pollfd fds[3] = {{child.report_fd(), POLLIN, 0}, {child.stderr_fd(), POLLIN, 0}, {child.exit_fd(), POLLIN, 0}};
    // Without a pidfd, look for the child's exit every 100 ms.
    poll(fds, 3, child.exit_fd() >= 0 ? -1 : 100);
    for (auto& line : child.read_report()) run.output += line + "\n";
    child.read_stderr();
  }
  for (auto& line : child.finish_output()) run.output += line + "\n";
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
