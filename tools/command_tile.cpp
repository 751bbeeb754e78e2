// tessera tile: slides into an LMDB tile store (tissue detection, labels, resumable).
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/run_summary.h"
#include "common/units.h"
#include "data/tiler.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/run_record.h"
#include "tools/tiling_flags.h"

namespace tessera::cli {

namespace {

struct TileFlags {
  std::vector<std::string> slides, labels;
  std::string out, encoding = "jpeg", label_rule = "centre", commit_bytes = "64MiB", tile_cache = "64MiB", classes;
  data::TilerOptions options;
  data::Shard shard;
};

}  // namespace

void add_tile_command(CLI::App& app) {
  auto flags = std::make_shared<TileFlags>();
  flags->options.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto* command = app.add_subcommand("tile", "Tile slides into an LMDB tile store (tissue only, with labels)");
  command->add_option("SLIDE", flags->slides, "Slides (tiled TIFF/BigTIFF, or any format OpenSlide reads)")->required();
  command->add_option("--out", flags->out, "Tile store (LMDB directory); an unfinished run there resumes")->required();
  add_tiling_flags(*command, flags->options);
  add_shard_flag(*command, flags->shard);
  command->add_option("--labels", flags->labels,
                      "Per slide, in order: a label mask TIFF or GeoJSON annotations (.geojson)");
  auto& label_options = flags->options.labelling;
  command
      ->add_option("--label-rule", flags->label_rule,
                   "centre: the class of the smallest shape at the tile centre; coverage: the class covering the "
                   "largest fraction of the tile, if it reaches --label-coverage")
      ->capture_default_str();
  command->add_option("--label-coverage", label_options.coverage, "Fraction for --label-rule coverage")
      ->capture_default_str()
      ->check(finite_in(0, 1));
  auto* label_class = command
                          ->add_option("--label-class", label_options.label_class,
                                       "GeoJSON class of label 1 (label 0: any other class); not with --classes")
                          ->capture_default_str();
  auto* classes = command->add_option("--classes", flags->classes,
                      "GeoJSON classes in label order, e.g. Tumor,Stroma,Normal (label 0 is the first); shapes of "
                      "other classes annotate nothing");
  command->add_option("--unclassified-as", label_options.unclassified_as,
                      "GeoJSON shapes without a classification take this class (e.g. Tumor, as --label-class)");
  command->add_option("--unannotated", label_options.unannotated,
                      "The class of tissue no GeoJSON shape claims (e.g. Normal, for outlines of every tumour); "
                      "without it such tiles are left out of the store and counted");
  command->add_flag("--allow-empty-labels", flags->options.allow_empty_labels,
                    "Labels that give no tile a class are a warning, not an error (slides without tumour)");
  command->add_option("--encoding", flags->encoding, "Pixels in the store: jpeg or raw")->capture_default_str();
  command->add_option("--quality", flags->options.quality, "JPEG quality when tiles are encoded")
      ->capture_default_str()
      ->check(finite_in(1, 100));
  command->add_option("--workers", flags->options.workers, "Threads reading, decoding and encoding tiles")
      ->capture_default_str()
      ->check(finite_in(1, 1024));
  command->add_option("--commit-bytes", flags->commit_bytes, "Value bytes per transaction")->capture_default_str();
  command->add_option("--commit-tiles", flags->options.commit_tiles, "Most tiles per transaction")
      ->capture_default_str()
      ->check(finite_in(1, 1e9));
  command->add_option("--tile-cache", flags->tile_cache, "Decoded slide tiles kept in memory")->capture_default_str();
  command->callback([command, flags, label_class, classes] {
    auto& options = flags->options;
    if (flags->encoding == "jpeg")
      options.encoding = data::TileEncoding::jpeg;
    else if (flags->encoding == "raw")
      options.encoding = data::TileEncoding::raw;
    else
      throw UsageError("--encoding: jpeg or raw, not '" + flags->encoding + "'");
    auto& labelling = options.labelling;
    if (flags->label_rule == "centre" || flags->label_rule == "center")
      labelling.rule = data::LabelRule::centre;
    else if (flags->label_rule == "coverage")
      labelling.rule = data::LabelRule::coverage;
    else
      throw UsageError("--label-rule: centre or coverage, not '" + flags->label_rule + "'");
    if (labelling.coverage == 0) throw UsageError("--label-coverage: a fraction above 0");
    if (classes->count() > 0) {
      if (label_class->count() > 0)
        throw UsageError("--label-class: with --classes, the classes name every label; give one or the other");
      labelling.classes = data::parse_class_names(flags->classes);
    }
    data::check_label_options(labelling);
    options.commit_bytes = parse_bytes(flags->commit_bytes, "--commit-bytes");
    options.tile_cache_bytes = parse_bytes(flags->tile_cache, "--tile-cache");
    for (auto [flag, given] : {std::pair{"--unclassified-as", !labelling.unclassified_as.empty()},
                               std::pair{"--classes", !labelling.classes.empty()},
                               std::pair{"--unannotated", !labelling.unannotated.empty()}})
      if (flags->labels.empty() && given)
        throw UsageError(std::string(flag) + " applies to GeoJSON --labels, and none are given");
    if (!flags->labels.empty() && flags->labels.size() != flags->slides.size())
      throw UsageError("--labels: one per slide (" + std::to_string(flags->slides.size()) + "), got " +
                       std::to_string(flags->labels.size()));
    std::vector<data::SlideJob> jobs;
    for (size_t i : data::shard_members(flags->slides, flags->shard, "SLIDE"))
      jobs.push_back({flags->slides[i], flags->labels.empty() ? "" : flags->labels[i]});
    with_run_report(*command, flags->out, [&](nlohmann::json& summary, SlideObserver& observer) {
      summary = data::tile_slides(jobs, flags->out, options, &observer);
      summary["shard"] = {{"index", flags->shard.index}, {"count", flags->shard.count},
                          {"slides", jobs.size()}, {"of", flags->slides.size()}};
      print_result(summary, slides_table(summary["slides"], summary["written"], summary["seconds"]) +
                                "store: " + flags->out + "\n");
    });
  });
}

}  // namespace tessera::cli
