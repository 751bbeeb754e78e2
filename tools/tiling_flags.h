// The tiling flags that `tile` and `extract --slides` share, with one set of checks.
#pragma once
#include <CLI/CLI.hpp>

#include "data/tiler.h"

namespace tessera::cli {

// Adds --size, --level, --tissue, --min-tissue, --tissue-threshold and --intensity-window (one
// LOW,HIGH for every 16-bit channel), each refusing NaN and values out of range with exit 2
// before anything is read or written (--min-tissue and --tissue-threshold also with --tissue
// none, which makes no mask). Takes the command's parse-complete callback.
void add_tiling_flags(CLI::App& command, data::TilerOptions& options);

// Adds --shard K/N (the K-th of N parts of the slides; data/tiler.h's shard_members), refused
// with exit 2 when it is not K/N with 0 <= K < N.
void add_shard_flag(CLI::App& command, data::Shard& shard);

}  // namespace tessera::cli
