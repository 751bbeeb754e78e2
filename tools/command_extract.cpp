// tessera extract: per-slide feature files (CLAM layout) from a trained or
// imported model.
#include <memory>

#include "common/units.h"
#include "jobs/extract.h"
#include "tools/commands.h"
#include "tools/tiling_flags.h"
#include "tools/flag_checks.h"

namespace tessera::cli {

void add_extract_command(CLI::App &app) {
  auto *command = app.add_subcommand("extract", "Per-slide HDF5 feature files: a model run up to a named layer");
  auto options = std::make_shared<ExtractOptions>();
  auto precision = std::make_shared<std::string>("fp32");
  auto compression = std::make_shared<std::string>("none");
  auto random_weights = std::make_shared<bool>(false);
  auto memory_limit = std::make_shared<std::string>();
  command->add_option("--model", options->model, "Checkpoint .h5 or preset")->required();
  command->add_flag("--random-weights", *random_weights,
                    "Run a preset or model JSON with random weights (benchmarks); otherwise refused");
  command->add_option("--layer", options->layer, "Layer or module name (resnets: conv1, layer1 ... layer4; resnet50 layer3: CLAM's resnet50_trunc)")
      ->required();
  auto *slides = command->add_option("--slides", options->slides, "Slides, tiled into OUT/tiles.lmdb first");
  auto *tiles = command->add_option("--tiles", options->tiles,
                                    "Tile stores (tessera tile), several or a directory of them");
  slides->excludes(tiles);
  command->add_option("--out", options->out, "Directory of <slide>.h5 files; a killed run there resumes")->required();
  command->add_flag("--overwrite", options->overwrite,
                    "Replace feature files in --out that another slide or other settings made (without it, refused)");
  command->add_option("--batch", options->batch, "Tiles per dispatch")->capture_default_str();
  command->add_option("--precision", *precision, "Stored features: fp32 or fp16")
      ->check(CLI::IsMember({"fp32", "fp16"}))
      ->capture_default_str();
  command->add_option("--compression", *compression, "none or gzip")
      ->check(CLI::IsMember({"none", "gzip"}))
      ->capture_default_str();
  command->add_option("--workers", options->workers, "Threads decoding tiles")->capture_default_str();
  auto *device = command->add_option("--device", options->device, "Vulkan device index");
  command->add_option("--devices", options->devices,
                      "Vulkan device indices, e.g. 0,1: slides spread over them (a CPU device may be given twice)")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->excludes(device);
  command->add_option("--device-memory-limit", *memory_limit,
                      "Device memory budget of each device, e.g. 2GiB; a plan over it is exit 3 before any work");
  add_tiling_flags(*command, options->tiler);  // for --slides
  add_shard_flag(*command, options->shard);
  command->callback([options, precision, compression, random_weights, memory_limit] {
    refuse_untrained_model(options->model, *random_weights);
    if (!memory_limit->empty()) options->memory_budget = parse_bytes(*memory_limit, "--device-memory-limit");
    options->fp16 = *precision == "fp16";
    options->gzip = *compression == "gzip";
    extract_features(*options);
  });
}

}  // namespace tessera::cli
