#include "data/tiler.h"


#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "common/checked.h"
#include "common/error.h"
#include "common/progress.h"
#include "common/run_summary.h"
#include "common/utf8.h"
#include "common/units.h"
#include "data/jpeg.h"
#include "data/ordered_parallel.h"
#include "data/slide.h"
#include "data/slide_record.h"
#include "data/tile_source.h"
#include "data/tile_store.h"
#include "data/tissue.h"

namespace tessera::data {

namespace {

using Clock = std::chrono::steady_clock;

const char* encoding_name(TileEncoding encoding) { return encoding == TileEncoding::jpeg ? "jpeg" : "raw"; }

// What one grid position became.
struct TileResult {
  TileStoreWriter::Tile tile;
  std::optional<uint32_t> label;  // none: no annotation claims it, and it is left out
  bool copied = false;  // the file's JPEG bytes, not decoded and encoded again
  std::string corrupt;  // why the tile was skipped
};

// Adds `text` to the summary's warning (several are joined by "; ").
void add_warning(nlohmann::json& summary, const std::string& text) {
  std::string before = summary.value("warning", "");
  summary["warning"] = before.empty() ? text : before + "; " + text;
}

// The settings that must match for a run to continue a slide an earlier run started.
nlohmann::json settings_of(const SlideJob& job, const TilerOptions& options) {
  nlohmann::json settings = {{"level", options.level},
          {"tile_size", options.size},
          {"encoding", encoding_name(options.encoding)},
          {"quality", options.quality},
          {"min_tissue", options.min_tissue},
          {"tissue_threshold", options.tissue_threshold},
          {"labels", job.labels.empty() ? "" : canonical_path(job.labels)},
          {"label_rule", options.labelling.rule == LabelRule::centre ? "centre" : "coverage"},
          {"label_coverage", options.labelling.coverage},
          {"label_class", options.labelling.label_class}};
  // Recorded only when not the default, so that stores tiled before these settings existed resume.
  if (options.tissue != Stain::automatic) settings["tissue"] = stain_name(options.tissue);
  if (!options.labelling.unclassified_as.empty()) settings["unclassified_as"] = options.labelling.unclassified_as;
  // GeoJSON annotations are sparse: what tissue no shape claims became (a class, or null: left
  // out) is always recorded, so that a store tiled when it was labelled 0 is not resumed.
  if (!job.labels.empty() && is_geojson_path(job.labels)) {
    const std::string& unannotated = options.labelling.unannotated;
    settings["unannotated"] = unannotated.empty() ? nlohmann::json() : nlohmann::json(unannotated);
    if (!options.labelling.classes.empty()) settings["classes"] = options.labelling.classes;
  }
  if (options.intensity_window)
    settings["intensity_window"] = {options.intensity_window->low, options.intensity_window->high};
  return settings;
}

// A slide and its labels, opened and checked once, before any tile is written.
struct OpenedSlide {
  std::shared_ptr<const Slide> slide;
  std::unique_ptr<TileLabeler> labeler;  // none without labels: every tile gets label 0
};

// Where a job's slide goes in the store: a new id, or the id of the same content tiled before.
struct SlidePlan {
  uint32_t id = 0;
  std::string fingerprint;
  std::optional<SlideRecord> record;  // none for a new slide
};

// Decides every job's slide id before any tile is written. Throws BadInput when a path the store
// knows now holds other content, UsageError when settings differ from the earlier run's. An
// entry that holds no tile (a failed or killed run's, or a slide without tissue) is no earlier
// run to match: the slide is tiled again under its id with these settings.
std::vector<SlidePlan> plan_slides(const std::vector<SlideJob>& jobs, const TilerOptions& options,
                                   const std::map<uint32_t, SlideRecord>& slides, const std::string& store) {
  uint32_t next_id = slides.empty() ? 0 : slides.rbegin()->first + 1;
  std::vector<SlidePlan> plans;
  std::set<uint32_t> replaced;
  std::map<std::string, std::string> given;  // fingerprint -> slide
  for (const SlideJob& job : jobs) {
    std::string path = canonical_path(job.slide), fingerprint = slide_fingerprint(job.slide);
    nlohmann::json settings = settings_of(job, options);
    SlidePlan plan{.fingerprint = fingerprint};
    bool known = false;
    for (auto& [existing_id, existing] : slides) {
      if (existing.fingerprint != fingerprint) {
        if (existing.path == path)
          throw BadInput(path + ": the file changed since it was tiled into " + store + " (was " +
                         existing.fingerprint + ", now " + fingerprint +
                         "); tiles of two slides would mix under one name: use another --out");
        continue;
      }
      known = true;
      plan.id = existing_id;
      if (existing.settings == settings && existing.tile_size == options.size)
        plan.record = existing;
      else if (existing.tiles == 0)
        replaced.insert(existing_id);
      else if (existing.tile_size == options.size)
        throw UsageError("--out: " + store + " already holds " + path + " tiled with other settings (" +
                         existing.settings.dump() + "); use another --out");
    }
    if (!given.emplace(fingerprint, job.slide).second)
      throw UsageError("SLIDE: " + given[fingerprint] + " and " + job.slide + " are the same slide (same content)");
    if (!known) plan.id = next_id++;
    plans.push_back(std::move(plan));
  }
  for (auto& [existing_id, existing] : slides)
    if (!jobs.empty() && !replaced.count(existing_id) && existing.tile_size != options.size)
      throw UsageError("--size: " + store + " holds tiles of " + std::to_string(existing.tile_size) +
                       " pixels; use another --out for " + std::to_string(options.size));
  return plans;
}

class SlideTiler {
 public:
  SlideTiler(const SlideJob& job, OpenedSlide opened, const TilerOptions& options, TileStoreWriter& store)
      : job_(job),
        options_(options),
        store_(store),
        slide_(std::move(opened.slide)),
        labeler_(std::move(opened.labeler)) {}

  nlohmann::json run(const SlidePlan& plan) {
    auto start = Clock::now();
    std::string path = canonical_path(job_.slide);
    uint32_t id = plan.id;
    SlideRecord record = plan.record ? *plan.record
                                     : describe_slide(*slide_, path, plan.fingerprint, options_.level, options_.size,
                                                      settings_of(job_, options_));
    nlohmann::json summary = {{"slide", path}, {"id", id}};
    if (record.complete) {
      summary.update({{"status", "already complete"}, {"tiles", record.tiles}, {"unannotated", record.unannotated}});
      report("tile", slide_event(summary), slide_line(summary));
      return summary;
    }

    const SlideLevel& level = slide_->levels()[static_cast<size_t>(options_.level)];
    std::optional<TissueMask> tissue = find_tissue(*slide_, options_.size * level.downsample, options_);
    TileGrid grid = tissue_grid(*slide_, options_.level, options_.size, tissue ? &*tissue : nullptr,
                                options_.min_tissue);
    const size_t done = record.done;
    if (done > grid.kept.size())  // the same settings give the same grid: an edited or corrupt store
      throw BadInput(store_.path() + ": " + path + " was tiled up to tile " + std::to_string(done) + " of a grid of " +
                     std::to_string(grid.kept.size()) + " tissue tiles: a corrupt store; use another --out");
    auto source = live_grid_tiles(slide_, record, grid, tissue ? &*tissue : nullptr);
    // The grid and tissue as the source describes them; the progress as the store has it.
    record.grid_columns = grid.columns;
    record.grid_rows = grid.rows;
    record.tissue = source->record().tissue;
    record.tissue_level = source->record().tissue_level;
    record.candidates = grid.kept.size();
    Progress progress("tile", grid.kept.size(), "tile " + job_.slide);
    if (auto empty = why_empty(grid, level); !empty.empty()) {
      progress.event({{"warning", empty}, {"slide", path}});
      add_warning(summary, empty);
    } else if (labeler_) {
      check_labels_fit(grid, tissue ? &*tissue : nullptr, progress, summary);
    }
    size_t resumed_from = done;
    if (done == 0) store_.commit(id, record, {});

    bool aligned = encoding() == TileEncoding::jpeg && level.tile_width == options_.size &&
                   level.tile_height == options_.size;
    uint64_t copied = 0, written = 0;
    std::vector<TileStoreWriter::Tile> batch;
    uint64_t batch_bytes = 0;
    std::string first_corrupt;
    auto commit = [&](size_t processed) {
      record.done = processed;
      store_.commit(id, record, batch);
      batch.clear();
      batch_bytes = 0;
    };
    const size_t candidates = grid.kept.size();
    ordered_parallel<TileResult>(
        candidates - done, options_.workers, static_cast<size_t>(options_.workers) * 32,
        [&](size_t i) { return make_tile(id, *source, grid, done + i, aligned); },
        [&](size_t i, TileResult&& result) {
          size_t processed = done + i + 1;
          if (!result.corrupt.empty()) {
            if (first_corrupt.empty()) first_corrupt = result.corrupt;
            ++record.corrupt_tiles;
            const nlohmann::json skipped = {{"warning", "corrupt tile skipped"},
                                            {"slide", path},
                                            {"level", options_.level},
                                            {"row", grid.row(done + i)},
                                            {"column", grid.column(done + i)},
                                            {"error", result.corrupt}};
            progress.event(skipped, "tile warning: corrupt tile skipped (level " + std::to_string(options_.level) +
                                        ", row " + std::to_string(grid.row(done + i)) + ", column " +
                                        std::to_string(grid.column(done + i)) + "): " + result.corrupt);
          } else if (!result.label) {
            ++record.unannotated;  // no annotation claims it and --unannotated gives it no class
          } else {
            const uint32_t label = *result.label;
            if (label >= record.label_counts.size()) record.label_counts.resize(label + size_t{1});
            ++record.label_counts[label];
            ++record.tiles;
            copied += result.copied;
            ++written;
            batch_bytes += result.tile.value.size();
            batch.push_back(std::move(result.tile));
          }
          if (batch_bytes >= options_.commit_bytes || batch.size() >= options_.commit_tiles || processed == candidates)
            commit(processed);
          progress.update(processed, {{"slide", id}, {"written", written}});
        });
    if (record.tiles == 0 && record.corrupt_tiles > 0)
      throw BadInput(path + ": every tissue tile is corrupt (" + std::to_string(record.corrupt_tiles) +
                     "), the first: " + first_corrupt);
    if (record.tiles == 0 && record.unannotated > 0) {
      std::string none = path + ": no annotation of " + job_.labels + " claims any of its " +
                         std::to_string(record.unannotated) +
                         " tissue tiles, so none is stored (--unannotated CLASS gives the tissue outside the "
                         "shapes a class)";
      progress.event({{"warning", none}});
      add_warning(summary, none);
    }
    record.complete = true;
    commit(candidates);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    summary.update({{"status", resumed_from ? "resumed" : "tiled"},
                    {"grid", {grid.columns, grid.rows}},
                    {"channels", slide_->channels()},
                    {"encoding", encoding_name(encoding())},
                    {"tissue", record.tissue},
                    {"candidates", candidates},
                    {"resumed_from", resumed_from},
                    {"written", written},
                    {"copied_jpeg", copied},
                    {"corrupt_tiles", record.corrupt_tiles},
                    {"unannotated", record.unannotated},
                    {"tiles", record.tiles},
                    {"label_counts", record.to_json()["label_counts"]},
                    {"seconds", seconds},
                    {"tiles_per_second", seconds > 0 ? static_cast<double>(written) / seconds : 0.0}});
    progress.finish(slide_event(summary), slide_line(summary));
    return summary;
  }

 private:
  // Why a slide gives no tile, naming it; empty when it gives some.
  std::string why_empty(const TileGrid& grid, const SlideLevel& level) const {
    if (grid.columns * grid.rows == 0)
      return job_.slide + ": no tile of " + std::to_string(options_.size) + " pixels fits in its level " +
             std::to_string(options_.level) + " (" + std::to_string(level.width) + "x" +
             std::to_string(level.height) + ")";
    if (grid.kept.empty())
      return job_.slide + ": no tissue tile: none of its " + std::to_string(grid.columns * grid.rows) +
             " tiles is at least " + format_number(options_.min_tissue) + " tissue (--min-tissue)";
    return {};
  }

  // Labels that mark no tile of the grid (GeoJSON beside the slide, an empty mask; TileLabeler::
  // marks: the label class, or with --classes any class), or whose marks lie mostly off the
  // tissue (the labels of another slide), are refused naming the file; --allow-empty-labels
  // turns the first into a warning, for slides without tumour.
  void check_labels_fit(const TileGrid& grid, const TissueMask* tissue, Progress& progress,
                        nlohmann::json& summary) const {
    const double extent = grid.size * slide_->levels()[static_cast<size_t>(grid.level)].downsample;
    uint64_t labelled = 0, on_tissue = 0;  // over the whole grid, tissue or not
    for (int64_t row = 0; row < grid.rows; ++row)
      for (int64_t column = 0; column < grid.columns; ++column) {
        double x0 = static_cast<double>(column) * extent, y0 = static_cast<double>(row) * extent;
        if (!labeler_->marks(x0, y0, x0 + extent, y0 + extent)) continue;
        ++labelled;
        on_tissue += !tissue || tissue->tissue_fraction(x0, y0, x0 + extent, y0 + extent) > 0;
      }
    const SlideLevel& base = slide_->levels()[0];
    std::string slide = job_.slide + " (" + std::to_string(base.width) + "x" + std::to_string(base.height) + ")";
    if (std::string warning = labeler_->warning(); !warning.empty()) {
      progress.event({{"warning", warning}});
      add_warning(summary, warning);
    }
    if (labelled == 0) {
      std::string message = job_.labels + ": labels no tile of " + slide + " with " + labeler_->marked() + " (" +
                            labeler_->description() + ")";
      if (!options_.allow_empty_labels)
        throw BadInput(message + "; if the slide truly has none, pass --allow-empty-labels");
      progress.event({{"warning", message}});
      add_warning(summary, message);
    } else if (on_tissue * 2 < labelled) {
      throw BadInput(job_.labels + ": " + std::to_string(labelled - on_tissue) + " of the " + std::to_string(labelled) +
                     " tiles it labels lie on glass of " + slide + ": the labels of another slide?");
    }
  }

  TileResult make_tile(uint32_t id, const TileSource& source, const TileGrid& grid, size_t index,
                       bool aligned) const {
    const int size = options_.size;
    const int64_t column = grid.column(index), row = grid.row(index);
    const TileOrigin origin = source.origin(index);
    const double extent = size * source.record().downsample;
    const auto x0 = static_cast<double>(origin.x), y0 = static_cast<double>(origin.y);
    TileResult result;
    result.label = labeler_ ? labeler_->label(x0, y0, x0 + extent, y0 + extent) : 0;
    if (!result.label) return result;  // left out: neither read nor stored
    const auto channels = static_cast<size_t>(slide_->channels());
    TileHeader header{static_cast<uint16_t>(size),
                      static_cast<uint16_t>(size),
                      narrow<uint8_t>(channels, Field(job_.slide, "channels")),
                      encoding(),
                      *result.label,
                      static_cast<uint32_t>(origin.x),
                      static_cast<uint32_t>(origin.y)};
    result.tile.key = {id, static_cast<uint32_t>(options_.level), static_cast<uint32_t>(row),
                       static_cast<uint32_t>(column)};
    if (aligned) {
      if (auto jpeg = slide_->jpeg_tile(options_.level, column, row)) {
        if (auto problem = check_jpeg(jpeg->data(), jpeg->size(), size, size); !problem.empty()) {
          result.corrupt = job_.slide + ": level " + std::to_string(options_.level) + " tile column " +
                           std::to_string(column) + " row " + std::to_string(row) + ": corrupt JPEG: " + problem;
          return result;
        }
        result.tile.value = encode_tile_value(header, jpeg->data(), jpeg->size());
        result.copied = true;
        return result;
      }
    }
    std::vector<uint8_t> pixels(static_cast<size_t>(size) * size * channels);
    try {
      source.read(index, pixels.data());
    } catch (const BadInput& e) {
      result.corrupt = e.what();
      return result;
    }
    if (header.encoding == TileEncoding::raw) {
      result.tile.value = encode_tile_value(header, pixels.data(), pixels.size());
    } else {
      auto jpeg = encode_jpeg(pixels.data(), size, size, options_.quality);
      result.tile.value = encode_tile_value(header, jpeg.data(), jpeg.size());
    }
    return result;
  }

  // JPEG holds a colour image; a slide of other than 3 channels is stored raw.
  TileEncoding encoding() const { return slide_->rgb() ? options_.encoding : TileEncoding::raw; }

  const SlideJob& job_;
  const TilerOptions& options_;
  TileStoreWriter& store_;
  std::shared_ptr<const Slide> slide_;
  std::unique_ptr<TileLabeler> labeler_;
};

}  // namespace

namespace {

std::vector<const Slide*> opened_slides(const std::vector<OpenedSlide>& opened) {
  std::vector<const Slide*> slides;
  for (const OpenedSlide& slide : opened) slides.push_back(slide.slide.get());
  return slides;
}

// `part` as a whole unsigned number, no sign, space or trailing text.
bool whole_number(std::string_view part, uint32_t& value) {
  auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), value);
  return !part.empty() && error == std::errc() && end == part.data() + part.size();
}

}  // namespace

Shard parse_shard(const std::string& text) {
  Shard shard;
  size_t slash = text.find('/');
  std::string_view whole(text);
  if (slash == std::string::npos || !whole_number(whole.substr(0, slash), shard.index) ||
      !whole_number(whole.substr(slash + 1), shard.count) || shard.count == 0 || shard.index >= shard.count)
    throw UsageError("--shard: K/N with 0 <= K < N (K as SLURM_ARRAY_TASK_ID counts, from 0), not '" + text + "'");
  return shard;
}

IntensityWindow parse_intensity_window(const std::string& text) {
  IntensityWindow window;
  size_t comma = text.find(',');
  std::string_view whole(text);
  if (comma == std::string::npos || !whole_number(whole.substr(0, comma), window.low) ||
      !whole_number(whole.substr(comma + 1), window.high) || window.low >= window.high || window.high > 65535)
    throw UsageError("--intensity-window: LOW,HIGH with 0 <= LOW < HIGH <= 65535 (16-bit sample values), not '" +
                     text + "'");
  return window;
}

void check_intensity_window_applies(const std::vector<const Slide*>& slides,
                                    const std::optional<IntensityWindow>& window, const std::string& task) {
  if (!window || slides.empty()) return;
  std::string eight_bit;
  size_t eight_bit_count = 0;
  for (const Slide* slide : slides)
    if (slide->sample_bits() != 16) {
      eight_bit += (eight_bit.empty() ? "" : ", ") + slide->path();
      ++eight_bit_count;
    }
  const std::string flag = "--intensity-window " + std::to_string(window->low) + "," + std::to_string(window->high);
  if (eight_bit_count == slides.size())
    throw UsageError(flag + " maps 16-bit channels, and " +
                     (slides.size() == 1 ? "the slide is" : "all " + std::to_string(slides.size()) + " slides are") +
                     " 8-bit (" + eight_bit + "): it would change nothing; leave it out");
  if (eight_bit_count)
    report(task, {{"warning", flag + " maps the 16-bit slides only; " + std::to_string(eight_bit_count) +
                                  " 8-bit slides are read as they are: " + eight_bit}});
}

void check_tile_bytes(const Field& size_field, const std::string& slide, int64_t size, int64_t channels) {
  within(size, 1, max_tile_size, size_field, "pixels a tile header holds a side");
  Field bytes = size_field.renamed(size_field.name() + " " + std::to_string(size) + ": a tile of " + slide + ", " +
                                   std::to_string(size) + " x " + std::to_string(size) + " pixels x " +
                                   std::to_string(channels) + " channels, in bytes");
  within(multiply(multiply(size, size, bytes), channels, bytes), 1, static_cast<int64_t>(max_tile_pixel_bytes), bytes,
         "256 MiB, the most tessera reads a tile into");
}

std::vector<size_t> shard_members(const std::vector<std::string>& slides, const Shard& shard, const std::string& flag) {
  std::vector<std::pair<std::string, size_t>> sorted;
  for (size_t i = 0; i < slides.size(); ++i) sorted.emplace_back(canonical_path(slides[i]), i);
  std::sort(sorted.begin(), sorted.end());
  std::vector<size_t> members;
  for (size_t rank = 0; rank < sorted.size(); ++rank) {
    if (rank > 0 && sorted[rank].first == sorted[rank - 1].first)
      throw UsageError(flag + ": " + sorted[rank].first + " is listed twice");
    if (rank % shard.count == shard.index) members.push_back(sorted[rank].second);
  }
  std::sort(members.begin(), members.end());
  return members;
}

nlohmann::json tile_slides(const std::vector<SlideJob>& jobs, const std::string& store, const TilerOptions& options,
                           SlideObserver* observer) {
  auto start = Clock::now();
  check_label_options(options.labelling);
  // Every input is opened and checked once, before the first tile is written; each slide is
  // tiled from what was opened, and closed once it is done.
  std::string too_small;  // slides the tile size does not fit
  size_t too_small_count = 0;
  std::vector<OpenedSlide> opened;
  opened.reserve(jobs.size());
  for (const SlideJob& job : jobs) {
    auto slide = open_slide(job.slide, options.tile_cache_bytes, SlideReader::automatic, options.intensity_window);
    if (options.level < 0 || static_cast<size_t>(options.level) >= slide->levels().size())
      throw UsageError("--level: " + job.slide + " has levels 0 to " + std::to_string(slide->levels().size() - 1));
    const SlideLevel& level = slide->levels()[static_cast<size_t>(options.level)];
    if (level.width < options.size || level.height < options.size) {
      too_small += (too_small.empty() ? "" : ", ") + job.slide + " is " + std::to_string(level.width) + "x" +
                   std::to_string(level.height);
      ++too_small_count;
    } else {  // a slide the tile does not fit gives no tile (a warning), whatever its bytes
      check_tile_bytes(Field::flag("--size"), job.slide, options.size, slide->channels());
    }
    check_stain_fits(options.tissue, *slide);
    std::unique_ptr<TileLabeler> labeler;
    if (!is_valid_utf8(job.labels))  // the store's settings record it
      throw BadInput(valid_utf8(job.labels) + ": the path is not valid UTF-8 (a Latin-1 name?); the store records "
                     "it as UTF-8: rename the file");
    if (!job.labels.empty())
      labeler = open_labels(job.labels, slide->levels()[0].width, slide->levels()[0].height, options.labelling);
    opened.push_back({std::move(slide), std::move(labeler)});
  }
  check_intensity_window_applies(opened_slides(opened), options.intensity_window, "tile");
  if (!jobs.empty() && too_small_count == jobs.size())
    throw BadInput("--size " + std::to_string(options.size) + ": no slide holds a whole tile at level " +
                   std::to_string(options.level) + ": " + too_small);
  TileStoreWriter writer(store);
  try {
    auto plans = plan_slides(jobs, options, writer.slides(), store);
    nlohmann::json slides = nlohmann::json::array();
    for (const SlideJob& job : jobs) {
      const std::string path = canonical_path(job.slide);
      slides.push_back({{"slide", path}, {"path", path}, {"status", "not started"}});
    }
    if (observer) observer->slides_listed(slides);
    uint64_t written = 0, corrupt = 0, unannotated = 0, tiles = 0;
    std::string reasons;
    for (size_t i = 0; i < jobs.size(); ++i) {
      nlohmann::json summary;
      try {
        summary = SlideTiler(jobs[i], std::move(opened[i]), options, writer).run(plans[i]);
      } catch (const std::exception& e) {
        if (observer)
          observer->slide_ended(i, {{"slide", slides[i]["slide"]}, {"status", "failed"}, {"error", e.what()}});
        throw;
      }
      if (observer) observer->slide_ended(i, summary);
      written += summary.value("written", uint64_t{0});
      corrupt += summary.value("corrupt_tiles", uint64_t{0});
      unannotated += summary.value("unannotated", uint64_t{0});
      tiles += summary.value("tiles", uint64_t{0});
      reasons += (reasons.empty() ? "" : "; ") + summary.value("warning", jobs[i].slide + ": no tile");
      slides[i] = std::move(summary);
    }
    // A run that tiles slides into nothing has failed, though every step succeeded.
    if (!jobs.empty() && tiles == 0) throw BadInput("no tile from any slide: " + reasons);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return {{"store", store},
            {"slides", slides},
            {"written", written},
            {"corrupt_tiles", corrupt},
            {"unannotated", unannotated},
            {"map_size", writer.map_size()},
            {"seconds", seconds},
            {"tiles_per_second", seconds > 0 ? static_cast<double>(written) / seconds : 0.0}};
  } catch (const Error& e) {
    // A store this run made and stored no tile in goes with the run; one that was there keeps
    // its entries, and those without a tile are tiled again by a run with other settings.
    if (!writer.created() || writer.tiles_committed() > 0) throw;
    writer.discard();
    throw Error(e.code(), std::string(e.what()) + " (no tile was stored: " + store + " is removed)");
  } catch (...) {
    if (writer.created() && writer.tiles_committed() == 0) writer.discard();
    throw;
  }
}

}  // namespace tessera::data
