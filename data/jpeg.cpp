#include "data/jpeg.h"

#include <turbojpeg.h>

#include <memory>
#include <stdexcept>

namespace tessera::data {

namespace {

struct HandleDeleter {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using Handle = std::unique_ptr<void, HandleDeleter>;

tjhandle compressor() {
  thread_local Handle handle(tjInitCompress());
  if (!handle) throw std::runtime_error("libturbojpeg: cannot create a compressor");
  return handle.get();
}

tjhandle decompressor() {
  thread_local Handle handle(tjInitDecompress());
  if (!handle) throw std::runtime_error("libturbojpeg: cannot create a decompressor");
  return handle.get();
}

std::string check_header(tjhandle handle, const uint8_t* data, size_t size, int width, int height) {
  int stream_width = 0, stream_height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(handle, data, static_cast<unsigned long>(size), &stream_width, &stream_height, &subsampling,
                          &colorspace) != 0)
    return tjGetErrorStr2(handle);
  if (stream_width != width || stream_height != height)
    return "JPEG is " + std::to_string(stream_width) + "x" + std::to_string(stream_height) + ", expected " +
           std::to_string(width) + "x" + std::to_string(height);
  return {};
}

}  // namespace

std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality) {
  tjhandle handle = compressor();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  if (tjCompress2(handle, rgb, width, 0, height, TJPF_RGB, &buffer, &size, TJSAMP_420, quality, 0) != 0) {
    tjFree(buffer);
    throw std::runtime_error(std::string("libturbojpeg: ") + tjGetErrorStr2(handle));
  }
  std::vector<uint8_t> jpeg(buffer, buffer + size);
  tjFree(buffer);
  return jpeg;
}

std::string decode_jpeg(const uint8_t* data, size_t size, int width, int height, uint8_t* rgb) {
  tjhandle handle = decompressor();
  if (auto problem = check_header(handle, data, size, width, height); !problem.empty()) return problem;
  if (tjDecompress2(handle, data, static_cast<unsigned long>(size), rgb, width, 0, height, TJPF_RGB,
                    TJFLAG_STOPONWARNING) != 0)
    return tjGetErrorStr2(handle);
  return {};
}

std::string check_jpeg(const uint8_t* data, size_t size, int width, int height) {
  tjhandle handle = decompressor();
  if (auto problem = check_header(handle, data, size, width, height); !problem.empty()) return problem;
  int small_width = (width + 7) / 8, small_height = (height + 7) / 8;
  std::vector<uint8_t> thumbnail(static_cast<size_t>(small_width) * static_cast<size_t>(small_height) * 3);
  if (tjDecompress2(handle, data, static_cast<unsigned long>(size), thumbnail.data(), small_width, 0, small_height,
                    TJPF_RGB, TJFLAG_STOPONWARNING) != 0)
    return tjGetErrorStr2(handle);
  return {};
}

}  // namespace tessera::data
