// JPEG through libturbojpeg; each thread keeps its own handles.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data {

// Baseline JPEG (4:2:0) of width x height x 3 RGB.
std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality);

// Decodes into width x height x 3 RGB. Returns an empty string on success, else what is wrong
// (a corrupt stream, other dimensions); warnings count as corruption.
std::string decode_jpeg(const uint8_t* data, size_t size, int width, int height, uint8_t* rgb);

// Checks a stream without reconstructing pixels at full size (entropy-decodes it at 1/8 scale);
// returns an empty string when it is a sound width x height JPEG, else what is wrong.
std::string check_jpeg(const uint8_t* data, size_t size, int width, int height);

}  // namespace tessera::data
