#include "sweep/process_scope.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>

#include "common/error.h"

namespace tessera::sweep {

StopSignals::StopSignals() {
  if (pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw Error(ExitCode::runtime_error, "pipe failed");
  write_end_ = pipe_[1];
  struct sigaction action {};
  action.sa_handler = [](int signal) {
    received_ = signal;
    char byte = 0;
    [[maybe_unused]] auto written = write(write_end_, &byte, 1);
  };
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // the pipe wakes poll(); other calls carry on
  for (size_t i = 0; i < signals.size(); ++i) sigaction(signals[i], &action, &saved_[i]);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < signals.size(); ++i) sigaction(signals[i], &saved_[i], nullptr);
  close(pipe_[0]);
  close(pipe_[1]);
}

void StopSignals::die() {
  int signal = received_;
  for (size_t i = 0; i < signals.size(); ++i) sigaction(signals[i], &saved_[i], nullptr);
  std::signal(signal, SIG_DFL);
  raise(signal);
  std::_Exit(128 + signal);
}

ScopedEnvironment::ScopedEnvironment(const Environment& variables) {
  for (auto& [name, value] : variables) {
    const char* old = std::getenv(name.c_str());
    saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
    if (value.empty()) unsetenv(name.c_str());
    else setenv(name.c_str(), value.c_str(), 1);
  }
}

ScopedEnvironment::~ScopedEnvironment() {
  for (auto& [name, old] : saved_) {
    if (old) setenv(name.c_str(), old->c_str(), 1);
    else unsetenv(name.c_str());
  }
}

StderrCapture::StderrCapture() : file_(std::tmpfile()) {
  std::fflush(stderr);
  saved_ = dup(STDERR_FILENO);
  if (file_) dup2(fileno(file_), STDERR_FILENO);
}

StderrCapture::~StderrCapture() {
  restore();
  if (file_) std::fclose(file_);
}

std::string StderrCapture::tail() {
  restore();
  if (!file_) return {};
  std::fseek(file_, 0, SEEK_END);
  long size = std::ftell(file_);
  long start = std::max<long>(0, size - static_cast<long>(ChildProcess::stderr_tail_bytes));
  std::fseek(file_, start, SEEK_SET);
  std::string text(static_cast<size_t>(size - start), '\0');
  text.resize(std::fread(text.data(), 1, text.size(), file_));
  return text;
}

void StderrCapture::restore() {
  if (saved_ < 0) return;
  std::fflush(stderr);
  dup2(saved_, STDERR_FILENO);
  close(saved_);
  saved_ = -1;
}

}  // namespace tessera::sweep
