// PNG output (libpng) for images the tools render, such as `tessera heatmap`.
#pragma once
#include <cstdint>
#include <string>

namespace tessera::data {

// Writes `width` x `height` 8-bit RGB pixels (row-major, 3 bytes each) to `path`: to
// `path`.partial, created new (common/output.h: never through a link), renamed over `path` when
// complete. The caller holds `path`'s OutputLock and has checked that it may replace it. Throws
// an Error naming the file when it cannot be written, leaving no temporary.
void write_png_rgb(const std::string& path, int width, int height, const uint8_t* rgb);

}  // namespace tessera::data
