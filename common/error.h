// Errors that carry tessera's exit codes (docs/architecture.md, "Exit codes").
#pragma once
#include <stdexcept>
#include <string>

namespace tessera {

enum class ExitCode : int {
  success = 0,
  runtime_error = 1,
  bad_usage = 2,
  out_of_device_memory = 3,
  diverged = 4,
  bad_input = 5,
};

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// A flag or argument that cannot work (exit 2).
struct UsageError : Error {
  explicit UsageError(const std::string& m) : Error(ExitCode::bad_usage, m) {}
};
// A device allocation that does not fit the budget or the device (exit 3).
struct OutOfDeviceMemory : Error {
  explicit OutOfDeviceMemory(const std::string& m) : Error(ExitCode::out_of_device_memory, m) {}
};
// A non-finite loss (exit 4).
struct Diverged : Error {
  explicit Diverged(const std::string& m) : Error(ExitCode::diverged, m) {}
};
// A missing, corrupt or unreadable input file (exit 5).
struct BadInput : Error {
  explicit BadInput(const std::string& m) : Error(ExitCode::bad_input, m) {}
};

// Exit code for any exception: tessera errors carry theirs, anything else is a runtime error.
int exit_code_of(const std::exception& e);

}  // namespace tessera
