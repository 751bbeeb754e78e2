// Byte sizes as people write them in flags.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

// "1073741824", "512MiB", "2GiB", "64KiB", "1.5GiB"; also KB/MB/GB as powers of 1000.
// Throws UsageError naming `flag` when the text is not a size.
uint64_t parse_bytes(std::string_view text, std::string_view flag);

// 123456789 -> "117.7 MiB".
std::string format_bytes(uint64_t bytes);

// A number as people write it, to 4 significant digits: 0.1 -> "0.1", 0.16666 -> "0.1667".
std::string format_number(double value);

}  // namespace tessera
