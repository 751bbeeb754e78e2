#include "tools/tiling_flags.h"

#include "tools/flag_checks.h"

namespace tessera::cli {

void add_tiling_flags(CLI::App& command, data::TilerOptions& options) {
  command.add_option("--size", options.size, "Tile size in pixels")->capture_default_str()->check(finite_in(8, 65535));
  command.add_option("--level", options.level, "Pyramid level to tile")->capture_default_str()->check(finite_in(0, 64));
  command.add_option("--min-tissue", options.min_tissue, "Least tissue fraction a kept tile has")
      ->capture_default_str()
      ->check(finite_in(0, 1));
  command
      .add_option("--tissue-threshold", options.tissue_threshold,
                  "Saturation (0-255) of a low-resolution pixel's mean colour from which it is tissue "
                  "(CLAM's default; data/README.md)")
      ->capture_default_str()
      ->check(finite_in(0, 255));
}

void add_shard_flag(CLI::App& command, data::Shard& shard) {
  command.add_option_function<std::string>(
      "--shard", [&shard](const std::string& text) { shard = data::parse_shard(text); },
      "K/N: only the K-th of N parts of the slides (K from 0, e.g. $SLURM_ARRAY_TASK_ID/N): sorted by path, "
      "slide i belongs to part i mod N");
}

}  // namespace tessera::cli
