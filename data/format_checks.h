// What `tessera doctor` says of each slide format: each reader is checked by what this binary
// does with a small file of the kind, written in a scratch directory and read back through
// open_slide (the path every command takes), or, where tessera writes no file of the kind, by
// asking the library.
#pragma once
#include <string>
#include <vector>

namespace tessera::data {

struct FormatCheck {
  std::string format;  // "TIFF / BigTIFF", "OpenSlide", "OME-TIFF", "DICOM", ...
  std::string reader;  // the library and its version
  std::string how;     // what was written and read back, or asked
  bool available = false;
  // false: a format tessera does not read by design (DICOM's JPEG 2000): reported, never a fault.
  bool required = true;
  std::string problem;  // why not, where not available
};

// Checks every reader, writing its files under `scratch` (an empty directory the caller removes).
std::vector<FormatCheck> check_slide_formats(const std::string& scratch);

}  // namespace tessera::data
