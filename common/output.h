// How every command writes its outputs (checkpoints, feature files, tile stores, study exports,
// synthetic slides, forward's arrays), so that nothing already written is lost or reached through
// a link:
// - an exclusive lock per output, held for the run (OutputLock), that names the run holding it;
// - temporaries created new with O_CREAT | O_EXCL | O_NOFOLLOW (create_new_file), never through a
//   link planted at their name, and renamed durably over the final name (files.h);
// - an existing final output replaced only when the run says so: --resume or --overwrite
//   (check_replaceable).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace tessera {

// Another run holds the output's lock (exit 1).
struct OutputInUse : Error {
  explicit OutputInUse(const std::string& m) : Error(ExitCode::runtime_error, m) {}
};

// An exclusive lock on one output, held from construction to destruction: flock() on the lock
// file `.<name>.lock` beside the output, which records the run holding it (pid, host, command,
// start time) for the message of a run that is refused. The lock file goes when the lock does.
class OutputLock {
 public:
  // Throws OutputInUse naming the output and the run that holds it; or Error naming the directory
  // and errno's text when the lock file cannot be made there (a read-only or missing directory),
  // which is how a run learns before any work that it could not write its output.
  explicit OutputLock(const std::string& output);
  // The lock, or nothing while another run holds it (then `holder` says which run, if given).
  static std::optional<OutputLock> try_lock(const std::string& output, std::string* holder = nullptr);
  ~OutputLock();
  OutputLock(OutputLock&& other) noexcept;
  OutputLock& operator=(OutputLock&& other) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  const std::string& output() const { return output_; }

 private:
  OutputLock() = default;
  // False, with `holder` set, when another run holds the lock.
  bool acquire(const std::string& output, std::string* holder);
  void release();

  std::string output_, lock_path_;
  int fd_ = -1;
};

// The arguments this process was started with, the program's name first (/proc/self/cmdline),
// and the machine's name: what a lock and a run report say of the run.
std::vector<std::string> process_arguments();
std::string host_name();

// What a run may do with an output that exists already.
enum class Existing {
  refuse,     // nothing given: an existing output is an error
  resume,     // --resume: continue what is there
  overwrite,  // --overwrite: replace it
};

// True when something is at `path`, a link included (even one pointing nowhere).
bool output_exists(const std::string& path);

// Throws UsageError (exit 2) naming `flag` and the path when an output exists there (a link
// included) and `existing` is refuse: the run would replace it. `remedy` says what to give
// ("give --overwrite to replace it").
void check_replaceable(const std::string& path, const std::string& flag, Existing existing,
                       const std::string& remedy = "give --overwrite to replace it");

// A file descriptor closed when it goes.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  int release();

 private:
  int fd_;
};

// Creates the temporary `path` new for writing (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644 less
// the umask). Whatever was at `path` before (a killed run's leftover, or a link planted there) is
// removed first, never followed: call it only for a temporary name under this run's OutputLock.
// Throws Error naming the file and errno's text, with the disk-full hint where that fits.
UniqueFd create_new_file(const std::string& path);

// True when `path` is a regular file that is not a link (a temporary a run may resume).
bool is_plain_file(const std::string& path);

// True when `path`, not followed, names the file open at `fd`: a library that opens files by
// name (HDF5, libtiff) opened the one this run created, not a link swapped in meanwhile.
bool names_file(const std::string& path, int fd);

// Writes `text` to the temporary `path`, made by create_new_file.
void write_new_file(const std::string& path, const std::string& text);

// Writes `text` to `path` through `path`.partial, created new, and renames it durably over
// `path` (the caller has checked that it may replace `path` and holds its lock).
void write_file_replacing(const std::string& path, const std::string& text);

// Writes `text` to the output `path` (a page, an export) under the discipline above: its lock held
// while it is written, an existing file replaced only with `overwrite` (otherwise UsageError
// naming `flag`), through a temporary created new and renamed.
void write_output_file(const std::string& path, const std::string& text, const std::string& flag, bool overwrite);

}  // namespace tessera
