// Checks for numeric flags. CLI11's own Range prints its bounds with 17 digits and lets NaN
// through (every comparison with NaN is false), so tessera's commands use these instead.
#pragma once
#include <CLI/CLI.hpp>

#include <limits>

namespace tessera::cli {

// A finite number in [low, high]; the message names the range as written ("in [0, 1]").
CLI::Validator finite_in(double low, double high);

// A finite number above zero.
CLI::Validator finite_positive();

// A finite number, zero or above.
inline CLI::Validator finite_non_negative() { return finite_in(0, std::numeric_limits<double>::max()); }

}  // namespace tessera::cli
