// What the libraries tessera reads through (libtiff, libvips, OpenSlide, DCMTK, HDF5) would print
// on the terminal by themselves becomes tessera's own warning, naming the file: once, with the
// repeats on other files counted and told when the command ends. Their errors are not here: the
// call that failed becomes tessera's error naming the file.
#pragma once
#include <string>

namespace tessera {

// The command whose lines the warnings are ("tile", "synth"...), set once it is known.
void set_library_warning_task(const std::string& task);

// `message` from `library` about `file` ("" when neither the library nor the caller can say):
// the first time a warning record (a line on a terminal, else a JSON line with `warning`, `file`
// and `library`); later times of the same library and message, on any file, only counted.
// Thread-safe: libraries report from the threads that call them.
void library_warning(const std::string& library, const std::string& file, const std::string& message);

// The warnings that came from more than one file, each once more with its count and the number
// of files; called when the command ends, whatever its outcome.
void report_repeated_library_warnings();

// In a child process that only probes a file its parent opens again: warnings are dropped.
void drop_library_warnings();

// The file the calling thread's library calls are about, for libraries whose messages do not
// name it (GLib's log of libvips and OpenSlide, DCMTK's logger): set for the life of the scope.
class LibraryFileScope {
 public:
  explicit LibraryFileScope(const std::string& path);
  ~LibraryFileScope();
  LibraryFileScope(const LibraryFileScope&) = delete;
  LibraryFileScope& operator=(const LibraryFileScope&) = delete;

 private:
  const std::string* previous_;
};
// The innermost scope's file on this thread; on a thread without one (a library's own worker
// thread), the file of the scope entered last on any thread; "" before any.
std::string library_file();

}  // namespace tessera
