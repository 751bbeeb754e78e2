// Child processes of the sweep: `tessera train` with its trial report on a pipe at fd 3 and its
// stderr captured, stdin and stdout on /dev/null. A child dies with the sweep (parent-death
// signal), so a killed sweep leaves no orphan trials behind. Each child leads a process group
// of its own: signals go to the group, and a trial ends when its child exits, whatever else of
// the group still holds its pipes (the rest of the group is then killed).
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace tessera::sweep {

// Variables set (or replaced) in the child's environment, on top of the sweep's own; an empty
// value removes the variable.
using Environment = std::vector<std::pair<std::string, std::string>>;

class ChildProcess {
 public:
  // The file descriptor the child writes its report lines to.
  static constexpr int report_descriptor = 3;

  enum class Output { discard, report };
  // Starts `command` (command[0] is a path); its stdout is discarded or joins the report pipe.
  // Throws Error if it cannot start.
  ChildProcess(const std::vector<std::string>& command, const Environment& environment,
               Output output = Output::discard);
  // Kills and reaps a child that is still running.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Open read ends to poll; -1 once at end of file.
  int report_fd() const { return report_fd_; }
  int stderr_fd() const { return stderr_fd_; }
  // Readable once the child has exited (a pidfd); -1 where the kernel has none.
  int exit_fd() const { return exit_fd_; }

  // The longest report line taken; a longer one is a protocol error, skipped to its newline.
  static constexpr size_t max_report_line = size_t{1} << 20;
  // Reads what the report pipe holds (at most a few MiB a call, so that one chatty child does
  // not starve the others) and returns the complete lines.
  std::vector<std::string> read_report();
  // Report lines skipped for their length, in words ("report line 3 is longer than ..."); empty
  // when there were none.
  const std::string& protocol_errors() const { return protocol_errors_; }
  // Reads what the stderr pipe holds into the tail.
  void read_stderr();
  // The last `stderr_tail_bytes` of stderr.
  const std::string& stderr_tail() const { return stderr_tail_; }
  static constexpr size_t stderr_tail_bytes = 4096;

  // Sends `signal` to the child's process group.
  void send(int signal) const;
  // True once the child has exited and been reaped; then `wait_status()` is its status. What the
  // child wrote before it exited is then in the pipes: the caller drains them with
  // finish_output() rather than waiting for their end, which a grandchild may hold off.
  bool try_reap();
  // After the child is reaped: kills what is left of its process group and reads what its
  // pipes hold to their end; returns the last report lines.
  std::vector<std::string> finish_output();
  // Blocks until the child has exited.
  void wait();
  bool reaped() const { return reaped_; }
  int wait_status() const { return wait_status_; }

 private:
  // Moves the complete lines of report_buffer_ into `lines`, keeping the unfinished one.
  void take_lines(std::vector<std::string>& lines);

  pid_t pid_ = -1;
  int report_fd_ = -1, stderr_fd_ = -1, exit_fd_ = -1;
  std::string report_buffer_, stderr_tail_, protocol_errors_;
  size_t report_lines_ = 0;     // complete lines seen, for messages
  bool skipping_line_ = false;  // inside an over-long line: dropped up to its newline
  bool reaped_ = false, group_killed_ = false;
  int wait_status_ = 0;
};

struct CapturedRun {
  int wait_status = 0;
  std::string output;  // stdout
  std::string errors;  // the tail of stderr
};

// Runs `command` to the end and returns its stdout, e.g. `tessera train --help`.
CapturedRun run_captured(const std::vector<std::string>& command, const Environment& environment = {});

// The resident memory of this process in bytes.
uint64_t resident_bytes();

}  // namespace tessera::sweep
