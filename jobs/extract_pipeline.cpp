#include "jobs/extract_pipeline.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "common/error.h"
#include "common/output.h"
#include "common/run_summary.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Rows a complete file holds as far as reading is concerned: none are needed.
constexpr int64_t complete_file = std::numeric_limits<int64_t>::max();

// Thrown inside a slide's reading when the device side has stopped taking batches.
struct ReaderStopped {};

// One-at-a-time models run over this many bytes of decoded tiles between loads.
constexpr uint64_t swap_chunk_bytes = uint64_t{512} << 20;

}  // namespace

SlideTimes &SlideTimes::operator+=(const SlideTimes &other) {
  read_seconds += other.read_seconds;
  resize_seconds += other.resize_seconds;
  device_seconds += other.device_seconds;
  wait_seconds += other.wait_seconds;
  device_wall_seconds += other.device_wall_seconds;
  write_seconds += other.write_seconds;
  decoded += other.decoded;
  return *this;
}

nlohmann::json SlideTimes::to_json() const {
  return {{"read_decode_seconds", read_seconds}, {"resize_seconds", resize_seconds},
          {"device_seconds", device_seconds},    {"data_wait_seconds", wait_seconds},
          {"device_wall_seconds", device_wall_seconds},
          {"write_seconds", write_seconds},      {"decoded_tiles", decoded}};
}

SharedRun::SharedRun(const ExtractInputs &inputs, const ExtractOptions &options, size_t devices,
                     SlideObserver *observer)
    : inputs_(inputs), options_(options), observer_(observer), next_(devices), summaries_(inputs.slides.size()),
      taken_(inputs.slides.size(), false), progress_("extract", inputs.slides.size()) {}

std::optional<size_t> SharedRun::checked(size_t slide) {
  if (halted_ || slide >= inputs_.slides.size()) return std::nullopt;
  std::lock_guard lock(mutex_);
  taken_[slide] = true;
  return slide;
}

void SharedRun::fail(std::exception_ptr error) {
  std::lock_guard lock(mutex_);
  if (!error_) error_ = error;
  halted_ = true;
  for (Channel<PipelineMessage> *channel : channels_) channel->stop();
}

void SharedRun::watch(Channel<PipelineMessage> &channel) { channels_.push_back(&channel); }

void SharedRun::event(const nlohmann::json &record) {
  std::lock_guard lock(mutex_);
  progress_.event(record);
}

void SharedRun::advance(uint64_t tiles, const std::string &slide) {
  std::lock_guard lock(mutex_);
  tiles_ += tiles;
  progress_.update(recorded_, {{"slide", slide}, {"tiles", tiles_}});
}

void SharedRun::record(size_t slide, nlohmann::json summary, const SlideTimes &times) {
  std::lock_guard lock(mutex_);
  total_ += times;
  progress_.event(slide_event(summary), slide_line(summary));
  progress_.update(++recorded_, {{"slide", summary["slide"]}, {"tiles", tiles_}});
  if (observer_) observer_->slide_ended(slide, summary);
  summaries_[slide] = std::move(summary);
}

const std::vector<nlohmann::json> &SharedRun::finish(SlideTimes &total, std::exception_ptr &error) {
  progress_.finish();
  error = error_;
  std::string why;
  try {
    if (error_) std::rethrow_exception(error_);
  } catch (const std::exception &e) {
    why = e.what();
  }
  // Slides in flight when an error ended the run, and those after one that could not be read
  // (when the run stopped there) or after the error.
  for (size_t slide = 0; slide < summaries_.size(); ++slide) {
    if (!summaries_[slide].is_null()) continue;
    summaries_[slide] = {{"slide", inputs_.slides[slide].name}, {"path", inputs_.slides[slide].path}};
    if (error_ && taken_[slide])
      summaries_[slide].update({{"status", "interrupted"}, {"error", "the run ended while it was read: " + why}});
    else
      summaries_[slide]["status"] = "not started";
  }
  total = total_;
  return summaries_;
}

DevicePipeline::DevicePipeline(size_t position, DeviceModels &models, SharedRun &run, int workers)
    : position_(position), models_(models), run_(run), workers_(workers) {
  run.watch(tiles_);
  run.watch(features_);
}

void DevicePipeline::start() {
  for (auto stage : {&DevicePipeline::read, &DevicePipeline::compute, &DevicePipeline::write})
    threads_.emplace_back([this, stage] {
      try {
        (this->*stage)();
      } catch (...) {
        run_.fail(std::current_exception());
      }
    });
}

nlohmann::json DevicePipeline::report() {
  nlohmann::json report = models_.report();
  report.update({{"slides", slides_},
                 {"tiles", tiles_extracted_},
                 {"hdf5_write_seconds", write_seconds_},
                 {"data_wait_seconds", wait_seconds_}});
  return report;
}

// ---- reader ---------------------------------------------------------------------------------

void DevicePipeline::read() {
  std::map<double, std::optional<data::TissueMask>> masks;  // the slide's, by tile extent
  for (auto slide = run_.take_first(position_); slide; slide = run_.take()) {
    const SlideInput &input = run_.inputs().slides[*slide];
    try {
      if (!input.error.empty()) throw BadInput(input.error);  // kept by --skip-errors
      PipelineMessage opened{PipelineMessage::Kind::opened, *slide};
      std::vector<int64_t> rows;
      int64_t complete_rows = 0;
      if (!open_files(*slide, opened.files, rows, complete_rows)) {
        run_.record(*slide,
                    {{"slide", input.name}, {"path", input.path}, {"file", feature_path(run_.inputs().models[0], input)},
                     {"status", "already complete"}, {"tiles", complete_rows}, {"device", position_}},
                    {});
        continue;
      }
      if (!tiles_.push(std::move(opened))) return;
      SlideTimes times;
      masks.clear();
      for (size_t read = 0; read < input.reads.size(); ++read) read_tiles(*slide, read, rows, times, masks);
      PipelineMessage done{PipelineMessage::Kind::read, *slide};
      done.times = times;
      if (!tiles_.push(std::move(done))) return;
    } catch (const ReaderStopped &) {
      return;
    } catch (const Error &e) {
      // A slide that cannot be read ends the run after the slides in flight (or, with
      // --skip-errors, alone); one whose file another run writes is left to that run.
      bool in_use = dynamic_cast<const OutputInUse *>(&e) != nullptr;
      if (!in_use && e.code() != ExitCode::bad_input && e.code() != ExitCode::bad_usage) throw;
      if (!in_use && !run_.options().skip_errors) run_.halt();
      PipelineMessage failed{PipelineMessage::Kind::failed, *slide};
      failed.error = e.what();
      failed.in_use = in_use;
      if (!tiles_.push(std::move(failed))) return;
    }
  }
  tiles_.close();
}

// Opens every model's feature file of the slide (each under its lock, resuming where it stopped);
// false when every one is complete already.
bool DevicePipeline::open_files(size_t slide, std::vector<std::unique_ptr<FeatureFileWriter>> &files,
                                std::vector<int64_t> &rows, int64_t &complete_rows) {
  const SlideInput &input = run_.inputs().slides[slide];
  const std::vector<ExtractModel> &models = run_.inputs().models;
  const Existing existing = run_.options().overwrite ? Existing::overwrite : Existing::refuse;
  files.resize(models.size());
  rows.assign(models.size(), complete_file);
  bool needed = false;
  complete_rows = 0;
  for (const SlideRead &read : input.reads)
    for (size_t m : read.models) {
      FeatureFileLayout layout = feature_layout(input, read, models[m], models_.at(m).extraction(), run_.options());
      auto file = std::make_unique<FeatureFileWriter>(feature_path(models[m], input), layout, existing);
      if (file->complete()) {
        complete_rows = std::max(complete_rows, file->rows());
        continue;
      }
      rows[m] = file->rows();
      files[m] = std::move(file);
      needed = true;
    }
  return needed;
}

// Reads the tiles of one of the slide's reads from the first row a model of it still needs.
void DevicePipeline::read_tiles(size_t slide, size_t read, const std::vector<int64_t> &rows, SlideTimes &times,
                                std::map<double, std::optional<data::TissueMask>> &masks) {
  const SlideInput &input = run_.inputs().slides[slide];
  const SlideRead &plan = input.reads[read];
  const std::vector<ExtractModel> &models = run_.inputs().models;
  int64_t first = complete_file;
  data::BatchReading reading;
  for (size_t m : plan.models) {
    if (rows[m] == complete_file) continue;
    first = std::min(first, rows[m]);
    if (std::find(reading.input_sizes.begin(), reading.input_sizes.end(), models[m].input_size) ==
        reading.input_sizes.end())
      reading.input_sizes.push_back(models[m].input_size);
  }
  if (first == complete_file) return;
  auto source = open_slide_read(input, plan, run_.options(), masks);
  if (source->size() == 0)
    run_.event({{"warning", (input.coords ? input.coords->file + ": holds no patch"
                                          : input.path + ": no tissue tile at level " + std::to_string(plan.record.level) +
                                                " in " + std::to_string(plan.record.tile_size) + "-pixel tiles") +
                                "; its feature files are empty"},
                {"slide", input.name}});
  reading.first = static_cast<size_t>(first);
  // Tiles a batch: --batch, or the largest the models on this device were given.
  int64_t capacity = run_.options().batch;
  for (size_t m = 0; m < models_.size(); ++m) capacity = std::max(capacity, models_.at(m).batch());
  reading.capacity = static_cast<size_t>(capacity);
  reading.workers = workers_;
  data::read_batches(*source, reading, [&](data::TileBatch &&batch) {
    times.read_seconds += batch.read_seconds;
    times.resize_seconds += batch.resize_seconds;
    times.decoded += batch.count;
    PipelineMessage message{PipelineMessage::Kind::batch, slide};
    message.read = read;
    message.tiles = std::move(batch);
    message.rows_done = rows;
    if (!tiles_.push(std::move(message))) throw ReaderStopped{};
    return true;
  });
}

// ---- device ---------------------------------------------------------------------------------

void DevicePipeline::compute() {
  // Models held together run on each batch as it comes; one at a time, over a chunk of batches
  // between loads, so that weights move once a chunk rather than once a batch.
  const uint64_t chunk_limit = models_.together() ? 0 : swap_chunk_bytes;
  std::vector<PipelineMessage> chunk;
  uint64_t chunk_bytes = 0;
  std::map<size_t, double> waited;  // by slide: the device waiting for its batches
  std::map<size_t, Clock::time_point> began;  // by slide: when the device began waiting for it
  PipelineMessage message;
  for (;;) {
    auto start = Clock::now();
    bool more = tiles_.pop(message);
    double wait = seconds_since(start);
    wait_seconds_ += wait;
    if (!more) break;
    waited[message.slide] += wait;
    began.try_emplace(message.slide, start);
    const bool batch = message.kind == PipelineMessage::Kind::batch;
    if (batch) {
      for (const auto &[size, pixels] : message.tiles.pixels) chunk_bytes += pixels.size();
      chunk.push_back(std::move(message));
      if (chunk_bytes < chunk_limit) continue;
    }
    run_models(chunk);
    chunk.clear();
    chunk_bytes = 0;
    if (batch) continue;
    message.times.wait_seconds += waited[message.slide];
    waited.erase(message.slide);
    if (message.kind != PipelineMessage::Kind::opened) {  // the slide's last message
      message.times.device_wall_seconds = seconds_since(began[message.slide]);
      began.erase(message.slide);
    }
    if (!features_.push(std::move(message))) return;
  }
  features_.close();
}

// Each model over the batches that hold rows its file lacks, in sub-batches of its own batch;
// a model that is loaded already goes first.
void DevicePipeline::run_models(std::vector<PipelineMessage> &batches) {
  if (batches.empty()) return;
  const std::vector<ExtractModel> &models = run_.inputs().models;
  std::vector<size_t> order(models.size());
  for (size_t m = 0; m < order.size(); ++m) order[m] = m;
  std::stable_partition(order.begin(), order.end(), [&](size_t m) { return models_.at(m).loaded(); });
  for (size_t m : order)
    for (PipelineMessage &batch : batches) {
      const SlideRead &read = run_.inputs().slides[batch.slide].reads[batch.read];
      const data::TileBatch &tiles = batch.tiles;
      const auto first = static_cast<int64_t>(tiles.first), count = static_cast<int64_t>(tiles.count);
      if (std::find(read.models.begin(), read.models.end(), m) == read.models.end() ||
          batch.rows_done[m] >= first + count)
        continue;
      Extractor &extractor = models_.use(m);
      const auto tile_bytes = static_cast<size_t>(models[m].input_size) * static_cast<size_t>(models[m].input_size) *
                              static_cast<size_t>(models[m].channels);
      for (int64_t at = std::max<int64_t>(batch.rows_done[m] - first, 0); at < count; at += extractor.batch()) {
        const int64_t rows = std::min<int64_t>(extractor.batch(), count - at);
        PipelineMessage features{PipelineMessage::Kind::features, batch.slide};
        double before = extractor.device_seconds();
        features.features = extractor.run(tiles.pixels.at(models[m].input_size).data() + at * tile_bytes, rows);
        features.times.device_seconds = extractor.device_seconds() - before;
        features.model = m;
        features.first_row = first + at;
        for (int64_t row = at; row < at + rows; ++row)
          features.coords.insert(features.coords.end(), {tiles.origins[row].x, tiles.origins[row].y});
        if (!features_.push(std::move(features))) return;
      }
    }
}

// ---- writer ---------------------------------------------------------------------------------

void DevicePipeline::write() {
  struct OpenSlide {
    std::vector<std::unique_ptr<FeatureFileWriter>> files;
    size_t lead = 0;  // the first model with a file to write: its rows are the slide's progress
    std::vector<int64_t> resumed_from;
    Clock::time_point start;
    SlideTimes times;
  };
  std::map<size_t, OpenSlide> open;
  // Slides whose features a file refused (a value that is not finite): what still comes of them
  // is dropped, and their partial files stay, never renamed.
  std::set<size_t> refused;
  PipelineMessage message;
  while (features_.pop(message)) {
    const SlideInput &input = run_.inputs().slides[message.slide];
    const std::vector<ExtractModel> &models = run_.inputs().models;
    nlohmann::json summary = {
        {"slide", input.name}, {"path", input.path}, {"file", feature_path(models[0], input)}, {"device", position_}};
    if (refused.contains(message.slide)) continue;
    switch (message.kind) {
      case PipelineMessage::Kind::opened: {
        OpenSlide &slide = open[message.slide];
        slide.files = std::move(message.files);
        for (auto &file : slide.files) slide.resumed_from.push_back(file ? file->rows() : -1);
        while (!slide.files[slide.lead]) ++slide.lead;
        slide.start = Clock::now();
        break;
      }
      case PipelineMessage::Kind::batch:
        break;  // the device does not forward batches
      case PipelineMessage::Kind::features: {
        OpenSlide &slide = open.at(message.slide);
        auto start = Clock::now();
        const auto rows = static_cast<int64_t>(message.coords.size() / 2);
        try {
          slide.files.at(message.model)->append(message.features.data(), message.coords.data(), rows);
        } catch (const BadInput &e) {
          // The slide fails as one that cannot be read does: the run stops after the slides in
          // flight, or with --skip-errors goes on without it.
          if (!run_.options().skip_errors) run_.halt();
          summary.update({{"status", "failed"}, {"error", e.what()}});
          slide.times += message.times;
          run_.record(message.slide, std::move(summary), slide.times);
          open.erase(message.slide);
          refused.insert(message.slide);
          break;
        }
        slide.times.write_seconds += seconds_since(start);
        slide.times += message.times;
        if (message.model == slide.lead) run_.advance(static_cast<uint64_t>(rows), input.name);
        break;
      }
      case PipelineMessage::Kind::read: {
        OpenSlide &slide = open.at(message.slide);
        slide.times += message.times;
        nlohmann::json per_model = nlohmann::json::array();
        int64_t tiles = 0, resumed_from = -1;
        for (size_t m = 0; m < slide.files.size(); ++m) {
          if (!slide.files[m]) {
            per_model.push_back({{"model", models[m].name}, {"status", "already complete"}});
            continue;
          }
          int64_t rows = slide.files[m]->rows();
          auto start = Clock::now();
          slide.files[m]->finish();
          slide.times.write_seconds += seconds_since(start);
          tiles = std::max(tiles, rows);
          resumed_from = resumed_from < 0 ? slide.resumed_from[m] : std::min(resumed_from, slide.resumed_from[m]);
          per_model.push_back({{"model", models[m].name}, {"file", feature_path(models[m], input)},
                               {"tiles", rows}, {"resumed_from", slide.resumed_from[m]}});
        }
        double seconds = seconds_since(slide.start);
        slides_ += 1;
        tiles_extracted_ += static_cast<uint64_t>(tiles - std::max<int64_t>(resumed_from, 0));
        write_seconds_ += slide.times.write_seconds;
        summary.update({{"status", resumed_from > 0 ? "resumed" : "extracted"},
                        {"tiles", tiles},
                        {"resumed_from", std::max<int64_t>(resumed_from, 0)},
                        {"seconds", seconds},
                        {"tiles_per_second", seconds > 0 ? static_cast<double>(tiles - std::max<int64_t>(resumed_from, 0)) / seconds : 0.0},
                        {"hdf5_write_seconds", slide.times.write_seconds},
                        {"times", slide.times.to_json()}});
        if (models.size() > 1) summary["models"] = per_model;
        run_.record(message.slide, std::move(summary), slide.times);
        open.erase(message.slide);
        break;
      }
      case PipelineMessage::Kind::failed: {
        SlideTimes times = message.times;
        if (auto found = open.find(message.slide); found != open.end()) {
          times += found->second.times;
          open.erase(found);  // its partial files stay, to resume from
        }
        summary.update({{"status", message.in_use ? "in use" : "failed"}, {"error", message.error}});
        run_.record(message.slide, std::move(summary), times);
        break;
      }
    }
  }
}

}  // namespace tessera
