#include "common/utf8.h"

#include <cstdint>

namespace tessera {

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    auto byte = static_cast<unsigned char>(text[at]);
    size_t length = byte < 0x80 ? 1 : (byte >> 5) == 0x6 ? 2 : (byte >> 4) == 0xE ? 3 : (byte >> 3) == 0x1E ? 4 : 0;
    uint32_t code = length == 2 ? byte & 0x1F : length == 3 ? byte & 0x0F : byte & 0x07;
    bool valid = length > 0 && at + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      auto next = static_cast<unsigned char>(text[at + k]);
      valid = (next & 0xC0) == 0x80;
      code = code << 6 | (next & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    if (valid && length > 1) {
      static constexpr uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
      valid = code >= least[length] && code <= 0x10FFFF && !(code >= 0xD800 && code <= 0xDFFF);
    }
    if (valid) {
      out.append(text.substr(at, length));
      at += length;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for one byte, then go on from the next
      ++at;
    }
  }
  return out;
}

}  // namespace tessera
