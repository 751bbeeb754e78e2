#include "jobs/extract_inputs.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <set>

#include "common/checked.h"
#include "common/error.h"
#include "compute/checkpoint.h"
#include "compute/safetensors.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;

// The folder of an encoder's feature files: a preset's name, or a model JSON's file name.
std::string folder_name(const std::string& encoder) {
  return fs::path(encoder).extension() == ".json" ? fs::path(encoder).stem().string() : encoder;
}

// What a live read of a slide depends on, so that a feature file made otherwise (another grid,
// tissue rule, a tile store's recompressed tiles, other coordinates) is not taken for this run's.
nlohmann::json live_settings(const data::TilerOptions& tiler, int level, int size) {
  nlohmann::json settings = {{"source", "slide"},
                             {"level", level},
                             {"tile_size", size},
                             {"min_tissue", tiler.min_tissue},
                             {"tissue_threshold", tiler.tissue_threshold},
                             {"tissue", data::stain_name(tiler.tissue)}};
  if (tiler.intensity_window) settings["intensity_window"] = {tiler.intensity_window->low, tiler.intensity_window->high};
  return settings;
}

nlohmann::json coords_settings(const data::PatchCoords& coords, int level, int size) {
  return {{"source", "coords"},
          {"coords", data::canonical_path(coords.file)},
          {"coords_fingerprint", data::slide_fingerprint(coords.file)},
          {"level", level},
          {"tile_size", size}};
}

// Where one model reads a live slide: {level, read size}.
std::pair<int, int> live_read(const ExtractOptions& options, const ExtractModel& model, const data::Slide& slide,
                              const std::string& path, const std::optional<data::PatchCoords>& coords) {
  std::vector<double> downsamples;
  for (const data::SlideLevel& level : slide.levels()) downsamples.push_back(level.downsample);
  if (coords) {
    // The file's squares, read at the level that gives the model's input size without enlarging.
    double extent = coords->extent(slide);
    if (extent < 0.9 * model.input_size)
      throw BadInput(coords->file + ": its patches are " + std::to_string(std::lround(extent)) +
                     " level-0 pixels a side, smaller than " + model.name + "'s " + std::to_string(model.input_size) +
                     "-pixel input; tessera does not enlarge tiles");
    auto read = data::read_at_magnification(path, downsamples, 1, extent / model.input_size, model.input_size,
                                            model.name);
    return {read.level, read.read_size};
  }
  if (model.encoder) {
    const EncoderInput& encoder = *model.encoder;
    double mpp = slide_microns_per_pixel(path, slide.mpp_x(), slide.mpp_y(), options.mpp);
    auto read = data::read_at_magnification(path, downsamples, mpp, encoder.microns_per_pixel, encoder.image_size,
                                            "encoder " + encoder.name);
    return {read.level, read.read_size};
  }
  if (options.tiler.level < 0 || static_cast<size_t>(options.tiler.level) >= slide.levels().size())
    throw UsageError("--level: " + path + " has levels 0 to " + std::to_string(slide.levels().size() - 1));
  return {options.tiler.level, options.tiler.size};
}

// The slide's reads, its models grouped by the level and size they read at.
std::vector<SlideRead> group_reads(const std::vector<ExtractModel>& models,
                                   const std::function<std::pair<int, int>(const ExtractModel&)>& where,
                                   const std::function<data::SlideRecord(int, int)>& describe) {
  std::map<std::pair<int, int>, SlideRead> reads;
  for (size_t m = 0; m < models.size(); ++m) {
    auto at = where(models[m]);
    auto [read, fresh] = reads.try_emplace(at);
    if (fresh) read->second.record = describe(at.first, at.second);
    read->second.models.push_back(m);
    std::vector<int>& sizes = read->second.input_sizes;
    if (std::find(sizes.begin(), sizes.end(), models[m].input_size) == sizes.end()) sizes.push_back(models[m].input_size);
  }
  std::vector<SlideRead> ordered;
  for (auto& [at, read] : reads) ordered.push_back(std::move(read));
  return ordered;
}

// Models that read every slide at one input size (a CNN) take it, and the channels, from the first
// slide; the others must agree.
void settle_input(std::vector<ExtractModel>& models, int size, int channels, bool rgb, const std::string& slide,
                  bool& settled) {
  for (ExtractModel& model : models) {
    if (model.encoder) {
      if (!rgb)
        throw BadInput(slide + " has " + data::channels_in_words(channels, rgb) + "; encoder " + model.name +
                       " reads RGB tiles");
      continue;
    }
    if (settled && (model.input_size != size || model.channels != channels))
      throw BadInput(slide + ": tiles of " + std::to_string(size) + " pixels and " + std::to_string(channels) +
                     " channels, other slides' " + std::to_string(model.input_size) + " and " +
                     std::to_string(model.channels) + ": one model input per run");
    model.input_size = size;
    model.channels = channels;
  }
  settled = true;
}

SlideInput live_slide(const ExtractOptions& options, std::vector<ExtractModel>& models, const std::string& path,
                      bool& settled) {
  SlideInput input;
  input.path = path;
  input.name = fs::path(path).stem().string();
  input.slide = data::open_slide(path, options.tiler.tile_cache_bytes, data::SlideReader::automatic,
                                 options.tiler.intensity_window);
  const data::Slide& slide = *input.slide;
  if (!options.coords.empty()) {
    std::string file = data::find_patch_coords(options.coords, input.name);
    if (file.empty())
      throw BadInput("--coords " + options.coords + ": no coordinates of " + path + " (looked for " + input.name +
                     "_patches.h5 and " + input.name + ".h5 there and in patches/)");
    input.coords = data::read_patch_coords(file);
    input.coords->check_fits(slide, path);
  }
  int input_size = input.coords ? static_cast<int>(input.coords->patch_size) : options.tiler.size;
  settle_input(models, input_size, slide.channels(), slide.rgb(), path, settled);
  data::check_stain_fits(options.tiler.tissue, slide);
  const std::string canonical = data::canonical_path(path), fingerprint = data::slide_fingerprint(path);
  input.reads = group_reads(
      models, [&](const ExtractModel& model) { return live_read(options, model, slide, path, input.coords); },
      [&](int level, int size) {
        data::check_tile_bytes(input.coords ? Field(input.coords->file, "coords patch_size") : Field::flag("--size"),
                               path, size, slide.channels());
        nlohmann::json settings =
            input.coords ? coords_settings(*input.coords, level, size) : live_settings(options.tiler, level, size);
        return data::describe_slide(slide, canonical, fingerprint, level, size, settings);
      });
  return input;
}

std::vector<SlideInput> store_slides(const ExtractOptions& options, std::vector<ExtractModel>& models,
                                     ExtractInputs& inputs) {
  struct Entry {
    const data::TileStore* store;
    uint32_t id;
    data::SlideRecord record;
  };
  std::vector<Entry> all;
  for (const std::string& path : data::find_tile_stores(options.tiles, "--tiles")) {
    const data::TileStore& store = *inputs.stores.emplace_back(std::make_unique<data::TileStore>(path));
    for (auto& [id, record] : store.slides()) all.push_back({&store, id, std::move(record)});
  }
  if (all.empty() && options.shard.count == 1)
    throw BadInput(options.tiles.front() + (options.tiles.size() > 1 ? " and the others" : "") + ": holds no slides");
  std::vector<std::string> paths;
  for (const Entry& entry : all) paths.push_back(entry.record.path.empty() ? entry.store->path() : entry.record.path);
  inputs.shard_of = all.size();
  std::vector<SlideInput> slides;
  bool settled = false;
  for (size_t i : data::shard_members(paths, options.shard, "--tiles")) {
    const Entry& entry = all[i];
    SlideInput input;
    input.path = paths[i];
    input.name = entry.record.stem();
    input.store = entry.store;
    input.store_id = entry.id;
    std::string where = entry.store->path() + ": slide " + input.name;
    if (!entry.record.complete)
      throw BadInput(where + " is not completely tiled (run tessera tile again)");
    settle_input(models, entry.record.tile_size, entry.record.channels, entry.record.rgb, where, settled);
    SlideRead read{entry.record, {}, {}};
    for (size_t m = 0; m < models.size(); ++m) {
      // An encoder's tiles must cover its field; they are resized to its input.
      if (models[m].encoder) check_tiles_fit_encoder(entry.store->path(), entry.record, options.mpp, *models[m].encoder);
      read.models.push_back(m);
      if (std::find(read.input_sizes.begin(), read.input_sizes.end(), models[m].input_size) == read.input_sizes.end())
        read.input_sizes.push_back(models[m].input_size);
    }
    input.reads.push_back(std::move(read));
    slides.push_back(std::move(input));
  }
  return slides;
}

// TRIDENT's magnifications of a feature file, as TRIDENT writes them and its users filter on them:
// {level 0's, the patches'}. Level 0's is a TRIDENT coordinates file's (TRIDENT copies its
// attributes), else TRIDENT's bucket of the slide's pixel size. The patches' is a TRIDENT
// coordinates file's own; an encoder's, 10 / its microns per pixel (0.5 um/px is 20x), whatever
// pixel size the slide is read at (0.457 um/px is 20x, not 18.29x); else level 0's over the
// level-0 pixels a patch pixel spans, that ratio taken as the whole number within 0.1 of it, as
// TRIDENT takes a level within 0.1 of a downsample for it (a level of 2.0005 is 20x of a 40x
// slide, not 19.99x). {0, 0} when the slide gives no pixel size and no file gives them.
std::pair<int64_t, double> trident_magnifications(const SlideInput& slide, const SlideRead& read,
                                                  const ExtractModel& model, double mpp) {
  const std::optional<data::PatchCoords>& coords = slide.coords;
  int64_t level0 = coords && coords->level0_magnification > 0 ? std::llround(coords->level0_magnification)
                                                               : trident_magnification(mpp);
  if (level0 <= 0) return {0, 0.0};
  if (coords && coords->target_magnification > 0) return {level0, coords->target_magnification};
  if (model.encoder && !coords) return {level0, 10.0 / model.encoder->microns_per_pixel};
  double ratio = coords ? coords->extent(*slide.slide) / static_cast<double>(coords->patch_size) : read.record.downsample;
  if (double whole = std::round(ratio); whole >= 1 && std::abs(ratio - whole) <= 0.1) ratio = whole;
  return {level0, static_cast<double>(level0) / ratio};
}

// A --model file that is not there, named before any slide is opened or weights read.
void check_weights_file(const std::string& weights) {
  if ((is_checkpoint_path(weights) || is_safetensors_path(weights)) && !fs::is_regular_file(weights))
    throw BadInput("--model " + weights + ": no such file");
}

}  // namespace

std::vector<ExtractModel> resolve_extract_models(const ExtractOptions& options) {
  std::vector<ExtractModel> models;
  if (options.encoders.empty()) {
    if (options.models.size() != 1) throw UsageError("--model: one model with --layer, not " +
                                                     std::to_string(options.models.size()));
    ExtractModel& model = models.emplace_back();
    model.name = options.models.front();
    model.folder = options.out;
    model.weights = options.models.front();
    check_weights_file(model.weights);
    return models;
  }
  std::set<std::string> named, folders;
  for (const std::string& encoder : options.encoders)
    if (!named.insert(encoder).second) throw UsageError("--encoder: " + encoder + " is named twice");
  if (!options.random_weights && options.models.size() != options.encoders.size())
    throw UsageError("--model: " + std::to_string(options.models.size()) + " weights files for " +
                     std::to_string(options.encoders.size()) +
                     " encoders: give one for each encoder, in the same order (--model A.safetensors,B.safetensors), "
                     "or --random-weights");
  for (size_t i = 0; i < options.encoders.size(); ++i) {
    ExtractModel& model = models.emplace_back();
    model.name = options.encoders[i];
    model.weights = options.random_weights ? "" : options.models[i];
    check_weights_file(model.weights);
    // The description alone (vit_graph checks its fields, which encoder_input relies on); the
    // weights are read by read_extract_weights.
    model.resolved = resolve_model("", 2, model.name);
    model.encoder = encoder_input(model.name);
    model.input_size = model.encoder->image_size;
    std::string folder = folder_name(model.name);
    if (!folders.insert(folder).second)
      throw UsageError("--encoder: two encoders would write their features to " + folder + "/ under --out");
    model.folder = options.encoders.size() == 1 ? options.out : (fs::path(options.out) / folder).string();
  }
  return models;
}

void read_extract_weights(std::vector<ExtractModel>& models) {
  for (ExtractModel& model : models)
    model.resolved = model.encoder ? resolve_model(model.weights, 2, model.name) : resolve_model(model.weights, 2);
}

ExtractInputs gather_extract_inputs(const ExtractOptions& options, std::vector<ExtractModel> models) {
  ExtractInputs inputs;
  if (!options.tiles.empty()) {
    inputs.slides = store_slides(options, models, inputs);
  } else {
    inputs.shard_of = options.slides.size();
    bool settled = false;
    for (size_t i : data::shard_members(options.slides, options.shard, "--slides")) {
      const std::string& path = options.slides[i];
      try {
        inputs.slides.push_back(live_slide(options, models, path, settled));
      } catch (const Error& e) {
        if (!options.skip_errors || (e.code() != ExitCode::bad_input && e.code() != ExitCode::bad_usage)) throw;
        SlideInput failed;
        failed.path = path;
        failed.name = fs::path(path).stem().string();
        failed.error = e.what();
        inputs.slides.push_back(std::move(failed));
      }
    }
  }
  std::vector<const data::Slide*> opened;
  for (const SlideInput& slide : inputs.slides)
    if (slide.slide) opened.push_back(slide.slide.get());
  data::check_intensity_window_applies(opened, options.tiler.intensity_window, "extract");
  std::map<std::string, std::string> writing;  // feature file name -> the slide writing it
  for (const SlideInput& slide : inputs.slides)
    if (auto [at, fresh] = writing.emplace(slide.name, slide.path); !fresh)
      throw UsageError((options.tiles.empty() ? "--slides: " : "--tiles: ") + at->second + " and " + slide.path +
                       " would both write " + slide.name + ".h5");
  inputs.models = std::move(models);
  return inputs;
}

std::unique_ptr<data::TileSource> open_slide_read(const SlideInput& slide, const SlideRead& read,
                                                  const ExtractOptions& options,
                                                  std::map<double, std::optional<data::TissueMask>>& masks) {
  if (slide.store) return slide.store->tiles(slide.store_id, read.record);
  if (slide.coords) return data::live_tiles_at(slide.slide, read.record, slide.coords->origins);
  const data::SlideRecord& record = read.record;
  const double extent = record.tile_size * record.downsample;
  auto found = masks.find(extent);
  if (found == masks.end()) found = masks.emplace(extent, data::find_tissue(*slide.slide, extent, options.tiler)).first;
  const data::TissueMask* mask = found->second ? &*found->second : nullptr;
  data::TileGrid grid = data::tissue_grid(*slide.slide, record.level, record.tile_size, mask, options.tiler.min_tissue);
  return data::live_grid_tiles(slide.slide, record, std::move(grid), mask);
}

FeatureFileLayout feature_layout(const SlideInput& slide, const SlideRead& read, const ExtractModel& model,
                                 const nlohmann::json& extraction, const ExtractOptions& options) {
  const data::SlideRecord& record = read.record;
  // A store's slide is known with its tile count, as feature files have always recorded it; a
  // live read by what decides its tiles.
  nlohmann::json identity = {{"path", record.path}, {"fingerprint", record.fingerprint}, {"settings", record.settings}};
  if (slide.store) identity["tiles"] = record.tiles;
  // An encoder's slide without its own pixel size was read at --mpp's.
  const double mpp = record.mpp_x > 0 || !model.encoder ? record.mpp_x : options.mpp;
  auto [level0_magnification, target_magnification] = trident_magnifications(slide, read, model, mpp);
  return {slide.name,
          record.tile_size,
          record.level,
          record.downsample,
          record.level_width,
          record.level_height,
          extraction.at("output_shape").at(0).get<int64_t>(),
          options.fp16,
          options.gzip,
          extraction,
          identity,
          record.width,
          record.height,
          model.encoder ? model.name : extraction.value("model", "") + ":" + extraction.value("layer", ""),
          level0_magnification,
          target_magnification};
}

std::string feature_path(const ExtractModel& model, const SlideInput& slide) {
  return (fs::path(model.folder) / (slide.name + ".h5")).string();
}

}  // namespace tessera
