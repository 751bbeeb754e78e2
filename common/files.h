// Files that must survive a crash or a power cut whole, and what a file's name says of it.
#pragma once
#include <string>

namespace tessera {

// Makes the finished file `from` durable (fsync), renames it over `to` and makes the rename
// durable (fsync of the directory), so that a power cut leaves either the old `to` or the new
// one. Throws a runtime error naming the file, with a disk-full hint.
void durable_rename(const std::string& from, const std::string& to);

// Makes the finished file `from` durable, gives it the name `to` only where nothing has that name
// (link(2): atomic and never replacing, on NFS too), removes the name `from` and makes both durable.
// False, with `from` left as it was, when `to` exists; throws a runtime error naming the file otherwise.
bool durable_link_new(const std::string& from, const std::string& to);

// " (is the disk full? ...)": the hint for a write that failed.
std::string disk_full_hint();

// The extension of `path`'s file name in lower case, with its dot (".svs"; "" where it has none).
std::string lowercase_extension(const std::string& path);

}  // namespace tessera
