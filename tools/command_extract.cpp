// tessera extract: per-slide feature files (CLAM layout) from trained or imported models, read
// straight from the slides or from tile stores.
#include <memory>

#include "common/error.h"
#include "common/units.h"
#include "compute/vit.h"
#include "jobs/extract.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/run_record.h"
#include "tools/tiling_flags.h"

namespace tessera::cli {

void add_extract_command(CLI::App &app) {
  auto *command = app.add_subcommand("extract", "Per-slide HDF5 feature files: a model run up to a named layer, or "
                                                "patch encoders, over tiles read straight from each slide");
  auto options = std::make_shared<ExtractOptions>();
  options->workers = default_extract_workers();
  auto precision = std::make_shared<std::string>("fp32");
  auto compression = std::make_shared<std::string>("none");
  auto memory_limit = std::make_shared<std::string>();
  command->add_option("--model", options->models,
                      "Checkpoint .h5 or preset; with --encoder, each encoder's weights (.safetensors or a converted "
                      "checkpoint), comma-separated in --encoder's order")
      ->delimiter(',')
      ->allow_extra_args(false);
  command->add_option("--encoder", options->encoders,
                      "Patch encoders, comma-separated (ViT presets: " + vit_preset_list() +
                          "; TRIDENT's name in brackets; or ViT model JSONs): each slide read once for all, each "
                          "encoder's files in OUT/<encoder>/ when there are several")
      ->delimiter(',')
      ->allow_extra_args(false);
  command->add_flag("--random-weights", options->random_weights,
                    "Run a preset, model JSON or encoder with random weights (benchmarks); otherwise refused");
  auto *layer = command->add_option(
      "--layer", options->layer,
      "Layer or module name (resnets: conv1, layer1 ... layer4; resnet50 layer3: CLAM's resnet50_trunc)");
  command->add_option("--mpp", options->mpp,
                      "Microns per level-0 pixel of slides whose files do not give it (an encoder needs it)")
      ->check(finite_in(0.01, 100));
  command->add_flag("--dry-run", options->dry_run,
                    "Print the memory plans of each device (the batch each model runs, and whether the models fit "
                    "together) and check them against the budget; nothing is read, written or allocated");
  auto *slides = command->add_option("--slides", options->slides,
                                     "Slides, read tile by tile as they are (no tile store, nothing re-encoded)");
  auto *tiles = command->add_option("--tiles", options->tiles,
                                    "Tile stores (tessera tile), several or a directory of them");
  slides->excludes(tiles);
  command->add_option("--coords", options->coords,
                      "Directory of patch coordinates made by CLAM (SLIDE.h5) or TRIDENT (SLIDE_patches.h5), there "
                      "or in its patches/: each slide's tiles are read at those, not on tessera's tissue grid")
      ->excludes(tiles);
  command->add_option("--out", options->out, "Directory of <slide>.h5 files; a killed run there resumes")->required();
  command->add_flag("--overwrite", options->overwrite,
                    "Replace feature files in --out that another slide or other settings made (without it, refused)");
  command->add_flag("--skip-errors", options->skip_errors,
                    "A slide that cannot be read, or whose features are not finite, is named in the summary and the "
                    "run goes on (without it, exit 5: a slide that cannot be opened stops the run before any work, "
                    "one whose tiles cannot be read or whose features are not finite stops it there, the slides "
                    "before it complete)");
  command->add_option("--batch", options->batch,
                      "Tiles per dispatch (default: the largest that fits the device's memory with a margin, up to 64 "
                      "on a GPU, and on a CPU device such as lavapipe up to four 224-pixel tiles' worth; the run's "
                      "JSON says which: batch_chosen)");
  command->add_option("--precision", *precision,
                      "Stored features: fp32 or fp16 (an encoder then runs in fp16 too; a CNN runs in fp32 and "
                      "stores fp16)")
      ->check(CLI::IsMember({"fp32", "fp16"}))
      ->capture_default_str();
  auto weights = std::make_shared<std::string>();
  add_weights_flag(*command, *weights);
  auto stream_weights = std::make_shared<std::string>();
  add_stream_weights_flag(*command, *stream_weights);
  command->add_option("--compression", *compression, "none or gzip")
      ->check(CLI::IsMember({"none", "gzip"}))
      ->capture_default_str();
  command->add_option("--workers", options->workers,
                      "Threads reading, decoding and resizing tiles ahead of the devices (default: the cores less one)")
      ->capture_default_str();
  auto *device = command->add_option("--device", options->device, "Vulkan device index");
  command->add_option("--devices", options->devices,
                      "Vulkan device indices, e.g. 0,1: slides spread over them (a CPU device may be given twice)")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->excludes(device);
  command->add_option("--device-memory-limit", *memory_limit,
                      "Device memory budget of each device, e.g. 2GiB; a plan over it is exit 3 before any work");
  add_tiling_flags(*command, options->tiler);  // the grid of --slides
  add_shard_flag(*command, options->shard);
  command->callback([command, layer, options, precision, compression, memory_limit, weights, stream_weights] {
    if (options->encoders.empty()) {
      if (layer->count() == 0) throw UsageError("--layer is required (or --encoder)");
      if (command->count("--weights"))
        throw UsageError("--weights is for --encoder: a model up to --layer keeps fp32 weights (its fp16 features "
                         "are float16 of its fp32 ones)");
      if (command->count("--stream-weights"))
        throw UsageError("--stream-weights is for --encoder: it streams the weights of a transformer's blocks");
      if (options->models.empty()) throw UsageError("--model is required (or --encoder)");
      if (options->models.size() > 1) throw UsageError("--model: one model with --layer (several with --encoder)");
      refuse_untrained_model(options->models.front(), options->random_weights);
    } else {
      for (const char *flag : {"--layer", "--size", "--level"})
        if (command->count(flag))
          throw UsageError(std::string(flag) + " is not for --encoder: its features come from tiles of its input "
                           "size at the magnification it was trained at");
      if (options->models.empty() == !options->random_weights)
        throw UsageError(options->models.empty()
                             ? "--encoder needs its weights: --model FILE (.safetensors or a converted checkpoint; "
                               "one for each encoder, comma-separated), or --random-weights"
                             : "--random-weights and --model: give one");
    }
    if (!options->coords.empty())
      for (const char *flag : {"--size", "--level", "--tissue", "--min-tissue", "--tissue-threshold"})
        if (command->count(flag))
          throw UsageError(std::string(flag) + " is not for --coords: its patches are the file's");
    if (!options->tiles.empty() && command->count("--intensity-window"))
      throw UsageError("--intensity-window is not for --tiles: a store's tiles are 8-bit already (give it to tessera "
                       "tile, or read the slides with --slides)");
    if (command->count("--batch") && options->batch < 1) throw UsageError("--batch must be at least 1");
    if (!memory_limit->empty()) options->memory_budget = parse_bytes(*memory_limit, "--device-memory-limit");
    options->fp16 = *precision == "fp16";
    options->fp16_weights = !options->encoders.empty() && fp16_weights(*weights, options->fp16);
    // The run report's settings give the weights' type the encoders ran with, chosen or not.
    if (!options->encoders.empty() && weights->empty())
      command->get_option("--weights")->default_str(options->fp16_weights ? "fp16" : "fp32");
    options->stream_weights = weight_streaming(*stream_weights);
    options->gzip = *compression == "gzip";
    if (options->dry_run) return extract_features(*options);  // nothing is written, nor reported
    with_run_report(*command, options->out, [&](nlohmann::json& summary, SlideObserver& observer) {
      extract_features(*options, &summary, &observer);
    });
  });
}

}  // namespace tessera::cli
