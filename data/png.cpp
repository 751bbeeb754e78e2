#include "data/png.h"

#include <png.h>

#include <unistd.h>

#include <cstdio>

#include "common/error.h"
#include "common/files.h"
#include "common/output.h"

namespace tessera::data {

namespace {

// libpng reports errors by longjmp, so nothing with a destructor may live in this frame.
bool write_rows(FILE* file, int width, int height, const uint8_t* rgb) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_init_io(png, file);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const size_t stride = static_cast<size_t>(width) * 3;
  for (int y = 0; y < height; ++y) png_write_row(png, rgb + static_cast<size_t>(y) * stride);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

void write_png_rgb(const std::string& path, int width, int height, const uint8_t* rgb) {
  if (width < 1 || height < 1) throw Error(ExitCode::runtime_error, path + ": cannot write an empty image");
  const std::string partial = path + ".partial";
  UniqueFd created = create_new_file(partial);  // never through a link planted at the name
  FILE* file = ::fdopen(created.get(), "wb");
  if (!file) throw Error(ExitCode::runtime_error, partial + ": cannot write" + disk_full_hint());
  created.release();  // the FILE owns it now
  bool written = write_rows(file, width, height, rgb);
  if (std::fclose(file) != 0 || !written) {
    ::unlink(partial.c_str());
    throw Error(ExitCode::runtime_error, path + ": cannot write the PNG" + disk_full_hint());
  }
  try {
    durable_rename(partial, path);
  } catch (...) {
    ::unlink(partial.c_str());
    throw;
  }
}

}  // namespace tessera::data
