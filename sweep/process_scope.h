// What the sweep holds around its trials for as long as they run: the stop signals that end
// a sweep (any isolation), and, for a trial run in this process (--isolation none), its
// environment variables and a capture of this process's stderr.
#pragma once
#include <signal.h>

#include <array>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sweep/child.h"

namespace tessera::sweep {

// SIGINT, SIGTERM and SIGHUP wake the run loop through a pipe; the sweep then stops its trials,
// records them as interrupted, and ends with the signal.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  int fd() const { return pipe_[0]; }
  int received() const { return received_; }
  // Ends the process with the signal, as if it had not been caught.
  [[noreturn]] void die();

 private:
  static constexpr std::array<int, 3> signals{SIGINT, SIGTERM, SIGHUP};
  static inline volatile sig_atomic_t received_ = 0;
  static inline int write_end_ = -1;
  int pipe_[2] = {-1, -1};
  std::array<struct sigaction, 3> saved_{};
};

// Sets (or, when empty, removes) variables for a trial in this process and puts the old
// values back afterwards.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const Environment& variables);
  ~ScopedEnvironment();
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Sends this process's stderr to a temporary file for the length of a trial.
class StderrCapture {
 public:
  StderrCapture();
  ~StderrCapture();
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  // The last ChildProcess::stderr_tail_bytes written; stderr is restored.
  std::string tail();

 private:
  void restore();
  std::FILE* file_;
  int saved_ = -1;
};

}  // namespace tessera::sweep
