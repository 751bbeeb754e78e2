#include "common/units.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

#include "common/error.h"

namespace tessera {

uint64_t parse_bytes(std::string_view text, std::string_view flag) {
  auto fail = [&] {
    return UsageError(std::string(flag) + ": '" + std::string(text) +
                      "' is not a byte size (examples: 1073741824, 512MiB, 2GiB)");
  };
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || value < 0 || !std::isfinite(value)) throw fail();
  std::string_view unit(end, static_cast<size_t>(text.data() + text.size() - end));
  static const std::array<std::pair<std::string_view, double>, 11> units{{
      {"", 1.0},
      {"B", 1.0},
      {"KiB", 1024.0},
      {"MiB", 1024.0 * 1024},
      {"GiB", 1024.0 * 1024 * 1024},
      {"TiB", 1024.0 * 1024 * 1024 * 1024},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
      {"K", 1024.0},
  }};
  for (auto [name, scale] : units) {
    if (unit != name) continue;
    double bytes = std::round(value * scale);
    // 2^64 is the first double past the largest uint64_t.
    if (!(bytes < 18446744073709551616.0))
      throw UsageError(std::string(flag) + ": '" + std::string(text) + "' is more bytes than can be counted (16 EiB)");
    return static_cast<uint64_t>(bytes);
  }
  throw fail();
}

std::string format_bytes(uint64_t bytes) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, names[unit]);
  return text;
}

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", value);
  return text;
}

}  // namespace tessera
