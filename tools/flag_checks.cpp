#include "tools/flag_checks.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace tessera::cli {

namespace {

// The number in `text`, or NaN when it is none.
double parse_number(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  return (end == text.c_str() || *end != '\0') ? std::nan("") : value;
}

std::string bound(double value) {
  if (value >= std::numeric_limits<double>::max()) return "inf";
  return CLI::detail::to_string(value);
}

}  // namespace

CLI::Validator finite_in(double low, double high) {
  std::string range = "[" + bound(low) + ", " + bound(high) + "]";
  if (high >= std::numeric_limits<double>::max()) range = "at least " + bound(low);
  return CLI::Validator(
      [low, high, range](std::string& text) -> std::string {
        double value = parse_number(text);
        if (!std::isfinite(value)) return text + " is not a finite number";
        if (value < low || value > high) return text + " is out of range: " + range;
        return {};
      },
      range);
}

CLI::Validator finite_positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = parse_number(text);
        if (!std::isfinite(value)) return text + " is not a finite number";
        if (value <= 0) return text + " is out of range: above 0";
        return {};
      },
      "above 0");
}

}  // namespace tessera::cli
