// Text that a file or a file name gives, made safe for what tessera writes it into: JSON (the
// store's slide records, progress lines), HDF5 strings and messages, which are all UTF-8.
#pragma once
#include <string>
#include <string_view>

namespace tessera {

// `text` with every byte that is not part of valid UTF-8 (RFC 3629: no overlong forms, surrogates
// or code points past U+10FFFF) replaced by U+FFFD: a Latin-1 "é" in a channel name.
std::string valid_utf8(std::string_view text);

// Whether `text` is valid UTF-8 as it is.
inline bool is_valid_utf8(std::string_view text) { return valid_utf8(text) == text; }

}  // namespace tessera
