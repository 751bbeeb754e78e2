#include "tools/tiling_flags.h"

#include "common/error.h"
#include "tools/flag_checks.h"

namespace tessera::cli {

void add_tiling_flags(CLI::App& command, data::TilerOptions& options) {
  command.add_option("--size", options.size, "Tile size in pixels")->capture_default_str()->check(finite_in(8, 65535));
  command.add_option("--level", options.level, "Pyramid level to tile")->capture_default_str()->check(finite_in(0, 64));
  auto* min_tissue = command.add_option("--min-tissue", options.min_tissue, "Least tissue fraction a kept tile has")
                         ->capture_default_str()
                         ->check(finite_in(0, 1));
  auto* threshold =
      command
          .add_option("--tissue-threshold", options.tissue_threshold,
                      "Bright-field: saturation (0-255) of a low-resolution pixel's mean colour from which it is "
                      "tissue (CLAM's default); fluorescence: the sum of its channels above the background's level "
                      "(data/README.md)")
          ->capture_default_str()
          ->check(finite_in(0, 255));
  auto* stain = command
                    .add_option_function<std::string>(
                        "--tissue", [&options](const std::string& text) { options.tissue = data::parse_stain(text); },
                        "How tissue is told from background: automatic (from the slide's brightness and channels), "
                        "brightfield, fluorescence, or none (every tile is kept)")
                    ->default_str("automatic");
  command.add_option_function<std::string>(
      "--intensity-window",
      [&options](const std::string& text) { options.intensity_window = data::parse_intensity_window(text); },
      "LOW,HIGH: 16-bit channels map LOW and below to 0, HIGH and above to 255, linearly between, the same "
      "for every channel and slide (default: each channel's 0.1st and 99.9th percentiles in its own slide)");
  // With --tissue none there is no mask for the other tissue flags to tune.
  command.parse_complete_callback([&options, min_tissue, threshold, stain] {
    if (options.tissue != data::Stain::none) return;
    for (auto* flag : {min_tissue, threshold})
      if (flag->count() > 0)
        throw UsageError(flag->get_name() + " does not apply with " + stain->get_name() +
                         " none (every tile is kept)");
  });
}

void add_shard_flag(CLI::App& command, data::Shard& shard) {
  command.add_option_function<std::string>(
      "--shard", [&shard](const std::string& text) { shard = data::parse_shard(text); },
      "K/N: only the K-th of N parts of the slides (K from 0, e.g. $SLURM_ARRAY_TASK_ID/N): sorted by path, "
      "slide i belongs to part i mod N");
}

}  // namespace tessera::cli
