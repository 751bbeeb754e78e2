// The libraries' own output (libtiff, libvips and OpenSlide through GLib's log, DCMTK's logger,
// HDF5's error stack) routed into tessera: warnings become tessera's warnings naming the file
// (common/library_warnings.h), errors are kept for the error the failing call becomes; nothing
// reaches the terminal by itself.
#pragma once
#include <tiffio.h>

#include <memory>
#include <string>

namespace tessera::data {

// Once per process, before any library call: the handlers of every library.
void capture_library_messages();

// TIFFOpen and TIFFFdOpen with this file's own handlers: its warnings name it, its errors are
// kept for last_tiff_error(). Null when it cannot be opened.
TIFF* open_tiff(const std::string& path, const char* mode);
TIFF* open_tiff_fd(int fd, const std::string& path, const char* mode);
// What libtiff last said was wrong on this thread ("module: text").
const std::string& last_tiff_error();

// open_tiff's result, closed when it goes out of scope.
struct TiffCloser {
  void operator()(TIFF* tiff) const { TIFFClose(tiff); }
};
using TiffFile = std::unique_ptr<TIFF, TiffCloser>;

}  // namespace tessera::data
