// tessera extract: per-slide feature files (CLAM layout) from a trained or
// imported model.
#include <memory>

#include "common/error.h"
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
  command->add_option("--model", options->model,
                      "Checkpoint .h5 or preset; with --encoder, its weights (.safetensors or a converted checkpoint)");
  command->add_option("--encoder", options->encoder,
                      "A patch encoder (uni, uni2-h, virchow2, h-optimus-0, prov-gigapath, vit-b16, or a ViT model "
                      "JSON): its features, from tiles read at the magnification it was trained at");
  command->add_flag("--random-weights", *random_weights,
                    "Run a preset, model JSON or encoder with random weights (benchmarks); otherwise refused");
  auto *layer = command->add_option(
      "--layer", options->layer,
      "Layer or module name (resnets: conv1, layer1 ... layer4; resnet50 layer3: CLAM's resnet50_trunc)");
  command->add_option("--mpp", options->mpp,
                      "Microns per level-0 pixel of slides whose files do not give it (an encoder needs it)")
      ->check(finite_in(0.01, 100));
  command->add_flag("--dry-run", options->dry_run,
                    "Print the memory plan of each device (and the batch it runs) and check it against the budget; "
                    "nothing is tiled, written or allocated");
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
  command->callback([command, layer, options, precision, compression, random_weights, memory_limit] {
    if (options->encoder.empty()) {
      if (layer->count() == 0) throw UsageError("--layer is required (or --encoder)");
      if (options->model.empty()) throw UsageError("--model is required (or --encoder)");
      refuse_untrained_model(options->model, *random_weights);
    } else {
      for (const char *flag : {"--layer", "--size", "--level"})
        if (command->count(flag))
          throw UsageError(std::string(flag) + " is not for --encoder: its features come from tiles of its input "
                           "size at the magnification it was trained at");
      if (options->model.empty() == !*random_weights)
        throw UsageError(options->model.empty()
                             ? "--encoder " + options->encoder + " needs its weights: --model FILE (.safetensors or a "
                                                                 "converted checkpoint), or --random-weights"
                             : "--random-weights and --model " + options->model + ": give one");
    }
    if (!memory_limit->empty()) options->memory_budget = parse_bytes(*memory_limit, "--device-memory-limit");
    options->fp16 = *precision == "fp16";
    options->gzip = *compression == "gzip";
    extract_features(*options);
  });
}

}  // namespace tessera::cli
