// tessera synth: a synthetic pyramidal slide with tumour regions and their ground truth.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "common/checked.h"
#include "common/error.h"
#include "common/output.h"
#include "common/progress.h"
#include "common/run_summary.h"
#include "data/synthetic_slide.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace tessera::cli {

namespace {

struct SynthFlags {
  std::string out, mask, geojson, stain = "brightfield";
  bool no_tumour = false, overwrite = false;
  data::SyntheticSlideOptions options;
};

std::string beside(const std::string& slide, const std::string& suffix) {
  std::filesystem::path path(slide);
  return (path.parent_path() / path.stem()).string() + suffix;
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto flags = std::make_shared<SynthFlags>();
  flags->options.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto* command = app.add_subcommand(
      "synth", "Write a synthetic pyramidal slide (bright-field or fluorescence) with tumour regions, a label mask "
               "and GeoJSON");
  command->add_option("OUT", flags->out, "Slide to write (.tiff)")->required();
  command->add_option("--width", flags->options.width, "Level-0 width in pixels")->required()->check(finite_in(1, 2147483648.0));
  command->add_option("--height", flags->options.height, "Level-0 height in pixels")->required()->check(finite_in(1, 2147483648.0));
  command->add_option("--seed", flags->options.seed, "Seed of the tissue layout and texture")->capture_default_str();
  command->add_option("--tile-size", flags->options.tile_size, "TIFF tile size in pixels (a multiple of 16)")
      ->capture_default_str()
      ->check(finite_in(16, 4096));
  command->add_option("--quality", flags->options.quality, "JPEG quality")->capture_default_str()->check(finite_in(1, 100));
  // Within what a TIFF resolution (a 32-bit rational of pixels per centimetre) records faithfully.
  command->add_option("--mpp", flags->options.mpp, "Microns per level-0 pixel")
      ->capture_default_str()
      ->check(finite_in(0.001, 1000));
  command->add_option("--mask", flags->mask, "Label mask to write (default: OUT's name with .mask.tiff)");
  command->add_option("--geojson", flags->geojson, "Tumour annotations to write (default: OUT's name with .geojson)");
  command->add_option("--workers", flags->options.workers, "Threads rendering and compressing tiles")
      ->capture_default_str()
      ->check(finite_in(1, 1024));
  command->add_option("--stain", flags->stain,
                      "brightfield (H&E-like on bright glass) or fluorescence (a multiplex panel on a dark background)")
      ->capture_default_str();
  auto* channels = command->add_option("--channels", flags->options.channels,
                                       "With --stain fluorescence: 3 writes the RGB composite; any other count an "
                                       "OME-TIFF of one plane a channel (DAPI, panCK, autofluorescence, immune cells)")
                       ->capture_default_str()
                       ->check(finite_in(1, 64));
  command->add_flag("--overwrite", flags->overwrite, "Replace OUT, its mask and GeoJSON where they exist (otherwise refused)");
  command->add_flag("--no-tumour", flags->no_tumour,
                    "Tissue without tumour (empty mask and GeoJSON): the seed's slide with its tumour left out");
  command->callback([flags, channels] {
    auto& options = flags->options;
    options.tumour = !flags->no_tumour;
    if (flags->stain != "brightfield" && flags->stain != "fluorescence")
      throw UsageError("--stain: brightfield or fluorescence, not '" + flags->stain + "'");
    options.fluorescence = flags->stain == "fluorescence";
    if (!options.fluorescence && channels->count() > 0 && options.channels != 3)
      throw UsageError("--channels: a bright-field slide is RGB (3); other counts need --stain fluorescence");
    if (options.tile_size % 16) throw UsageError("--tile-size: a multiple of 16 (TIFF tiles)");
    // A TIFF directory numbers its tiles in 32 bits.
    Field tiles = Field::flag("--width and --height in --tile-size tiles (columns x rows)");
    within(multiply((options.width + options.tile_size - 1) / options.tile_size,
                    (options.height + options.tile_size - 1) / options.tile_size, tiles),
           1, int64_t{UINT32_MAX} - 1, tiles, "the tiles a TIFF directory numbers: use a larger --tile-size");
    data::SyntheticSlidePaths paths{flags->out, flags->mask.empty() ? beside(flags->out, ".mask.tiff") : flags->mask,
                                    flags->geojson.empty() ? beside(flags->out, ".geojson") : flags->geojson};
    OutputLock lock(paths.slide);  // the three files are written together
    Existing existing = flags->overwrite ? Existing::overwrite : Existing::refuse;
    check_replaceable(paths.slide, "OUT", existing);
    check_replaceable(paths.mask, "--mask", existing);
    check_replaceable(paths.geojson, "--geojson", existing);
    auto summary = data::write_synthetic_slide(options, paths);
    print_result(summary, "synth: " + paths.slide + " (" + std::to_string(options.width) + "x" +
                              std::to_string(options.height) + ", " + std::to_string(summary["levels"].size()) +
                              (summary["levels"].size() == 1 ? " level" : " levels") + ", tumour " + format_number(summary["tumour_fraction"]) + " of the area)\n" +
                              "labels: " + paths.mask + ", " + paths.geojson + "\n");
  });
}

}  // namespace tessera::cli
