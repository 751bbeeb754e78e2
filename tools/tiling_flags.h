// The tiling flags that `tile` and `extract --slides` share, with one set of checks.
#pragma once
#include <CLI/CLI.hpp>

#include "data/tiler.h"

namespace tessera::cli {

// Adds --size, --level, --min-tissue and --tissue-threshold, each refusing NaN and values out of
// range with exit 2 before anything is read or written.
void add_tiling_flags(CLI::App& command, data::TilerOptions& options);

}  // namespace tessera::cli
