#include "jobs/extract.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/progress.h"
#include "compute/feature_file.h"
#include "compute/inference.h"
#include "compute/vk/context.h"
#include "data/tile_store.h"
#include "jobs/channel.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct TileBatch {
  std::vector<uint8_t> rgb;     // batch x size x size x 3
  std::vector<int64_t> coords;  // count x 2, level-0 x, y
  int64_t count = 0;
};

struct FeatureBatch {
  std::vector<float> features;  // count x D
  std::vector<int64_t> coords;
  int64_t count = 0;
};

// What moves from a device's reader through the device to its writer, in a slide's order: its
// file opened, batches (tiles, then their features), the slide read to its end, or the slide
// failed (its tiles cannot be read).
struct Message {
  enum class Kind { opened, batch, read, failed } kind = Kind::batch;
  size_t slide = 0;  // index into the run's slides
  std::unique_ptr<FeatureFileWriter> file;
  TileBatch tiles;
  FeatureBatch features;
  std::string error;
  bool in_use = false;  // failed: another run holds the slide's file
};

// Thrown inside the store's cursor walk when the device side has stopped
// reading.
struct ReaderStopped {};

std::string slide_name(const nlohmann::json &entry) {
  return fs::path(entry.value("name", entry.value("path", ""))).stem().string();
}

struct SlideWork {
  const data::TileStoreReader *store;
  uint32_t id;
  nlohmann::json entry;
};

// One device's model: the network up to the layer over the staged images.
class Extractor {
 public:
  Extractor(const ExtractOptions &options, const ResolvedModel &model, int tile_size, int channels, int device)
      : options_(options), tile_size_(tile_size), channels_(channels), context_(context_options(options, device)) {
    // uint8 pixels as read from the store (RGB, or a multiplex slide's channels) become the layer
    // the model reads as "input".
    InferenceOptions inference;
    inference.inputs = {{"images", {options.batch, tile_size, tile_size, channels}, DType::u8}};
    inference.prologue =
        nlohmann::json::array({{{"name", "input"}, {"type", "input_normalize"}, {"inputs", {"images"}}}});
    inference.layer = options.layer;
    inference.advice = "lower --batch, or raise --device-memory-limit";
    inference.weights_digest = true;
    model_ = std::make_unique<Inference>(context_, model, inference);
    const Shape &out = model_->output_shape();
    width_ = out[1];
    spatial_ = element_count(out) / (out[0] * out[1]);
    extraction_ = {{"model", options.model},
                   {"weights", model_->weights_digest()},
                   {"random_weights", !model.checkpoint},
                   {"layer", model_->layer()},
                   {"output_shape", Shape(out.begin() + 1, out.end())},
                   {"pooling", out.size() > 2 ? "global_average" : "none"},
                   {"precision", options.fp16 ? "fp16" : "fp32"},
                   {"tile_size", tile_size}};
    if (channels != 3) extraction_["channels"] = channels;  // RGB files keep the settings they always had
    output_.resize(static_cast<size_t>(element_count(out)));
  }

  const nlohmann::json &extraction() const { return extraction_; }
  int tile_size() const { return tile_size_; }
  int channels() const { return channels_; }

  // The feature file of a slide (its tile store entry) as this model writes it.
  FeatureFileLayout layout(const nlohmann::json &entry) const {
    return {slide_name(entry),
            tile_size_,
            entry.value("level", int64_t{0}),
            entry.value("downsample", 1.0),
            entry.value("level_width", int64_t{0}),
            entry.value("level_height", int64_t{0}),
            width_,
            options_.fp16,
            options_.gzip,
            extraction_,
            {{"path", entry.value("path", "")},
             {"fingerprint", entry.value("fingerprint", "")},
             {"settings", entry.value("settings", nlohmann::json())},
             {"tiles", entry.value("tiles", 0)}},

            entry.value("width", int64_t{0}),
            entry.value("height", int64_t{0}),
            entry.value("mpp_x", 0.0),
            extraction_.value("model", "") + ":" + extraction_.value("layer", "")};
  }

  // Runs a batch of tiles through the network; rows are the pooled features.
  FeatureBatch run(TileBatch &&tiles) {
    auto start = Clock::now();
    model_->input("images").upload(tiles.rgb.data(), tiles.rgb.size());
    model_->run();
    model_->output().download(output_.data(), output_.size() * sizeof(float));
    FeatureBatch batch{std::vector<float>(static_cast<size_t>(tiles.count * width_)), std::move(tiles.coords),
                       tiles.count};
    for (int64_t row = 0; row < tiles.count * width_; ++row) {
      const float *map = output_.data() + row * spatial_;
      double sum = 0;
      for (int64_t i = 0; i < spatial_; ++i) sum += map[i];
      batch.features[static_cast<size_t>(row)] = static_cast<float>(sum / static_cast<double>(spatial_));
    }
    device_seconds_ += seconds_since(start);
    return batch;
  }

  nlohmann::json report() {
    return {{"index", context_.info().index},
            {"name", context_.info().name},
            {"device_seconds", device_seconds_},
            {"planned_device_bytes", model_->plan().total()},
            {"peak_device_bytes", context_.allocator().stats().peak_bytes}};
  }

 private:
  static vk::ContextOptions context_options(const ExtractOptions &options, int device) {
    vk::ContextOptions context = vk::options_from_environment();
    context.device_index = device;
    context.memory_budget = options.memory_budget;
    return context;
  }

  const ExtractOptions &options_;
  int tile_size_, channels_;
  vk::Context context_;
  std::unique_ptr<Inference> model_;
  std::vector<float> output_;
  int64_t width_ = 0, spatial_ = 1;
  nlohmann::json extraction_;
  double device_seconds_ = 0;
};

// What the devices share: the next slide nobody has taken, the progress, each slide's summary
// (in the slides' order, whichever device made it), and the first error, which ends the run.
class SharedRun {
 public:
  SharedRun(const std::vector<SlideWork> &slides, uint64_t total, size_t devices)
      : slides_(slides), next_(devices), summaries_(slides.size()), progress_("extract", total) {}

  const std::vector<SlideWork> &slides() const { return slides_; }

  // Every channel of the run, so that an error stops them all.
  void watch(Channel<Message> &channel) { channels_.push_back(&channel); }

  // Device k's first slide is slide k, so that every device has work whenever there are as many
  // slides; later, the next slide nobody has taken. Nothing when all are taken or the run has failed.
  std::optional<size_t> take_first(size_t device) { return checked(device); }
  std::optional<size_t> take() { return checked(next_++); }

  void advance(uint64_t tiles, const std::string &slide) {
    std::lock_guard lock(mutex_);
    done_ += tiles;
    progress_.update(done_, {{"slide", slide}});
  }

  void record(size_t slide, nlohmann::json summary) {
    std::lock_guard lock(mutex_);
    if (summary["status"] == "failed" || summary["status"] == "in use")
      progress_.event({{"error", summary["error"]}, {"slide", summary["slide"]}});
    summaries_[slide] = std::move(summary);
  }

  // Ends the run: every queue stops at once and `error` reaches finish().
  void fail(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = error;
    failed_ = true;
    for (Channel<Message> *channel : channels_) channel->stop();
  }

  // After every thread has ended: the slides' summaries, or the error that ended the run.
  const std::vector<nlohmann::json> &finish() {
    progress_.finish();
    if (error_) std::rethrow_exception(error_);
    return summaries_;
  }

 private:
  std::optional<size_t> checked(size_t slide) const {
    if (failed_ || slide >= slides_.size()) return std::nullopt;
    return slide;
  }

  const std::vector<SlideWork> &slides_;
  std::atomic<size_t> next_;
  std::atomic<bool> failed_{false};
  std::mutex mutex_;  // guards what follows
  std::vector<nlohmann::json> summaries_;
  Progress progress_;
  uint64_t done_ = 0;
  std::exception_ptr error_;
  std::vector<Channel<Message> *> channels_;
};

// One device's share of the run, three threads joined by short queues: a reader that takes the
// next slide and decodes its tiles ahead of the device (the next slide's while the device
// computes this one's, so the device never waits between slides), the device, and a writer that
// appends the features to the slide's file and finishes it.
class DevicePipeline {
 public:
  DevicePipeline(size_t position, Extractor &extractor, SharedRun &run, const ExtractOptions &options)
      : position_(position), extractor_(extractor), run_(run), options_(options) {
    run.watch(tiles_);
    run.watch(features_);
  }

  void start() {
    for (auto stage : {&DevicePipeline::read, &DevicePipeline::compute, &DevicePipeline::write})
      threads_.emplace_back([this, stage] {
        try {
          (this->*stage)();
        } catch (...) {
          run_.fail(std::current_exception());
        }
      });
  }
  void join() { threads_.clear(); }

  nlohmann::json report() {
    nlohmann::json report = extractor_.report();
    report.update({{"slides", slides_}, {"tiles", tiles_extracted_}, {"hdf5_write_seconds", write_seconds_}});
    return report;
  }
  double write_seconds() const { return write_seconds_; }

 private:
  std::string file_path(const SlideWork &work) const {
    return (fs::path(options_.out) / (slide_name(work.entry) + ".h5")).string();
  }

  void read() {
    for (auto slide = run_.take_first(position_); slide; slide = run_.take()) {
      const SlideWork &work = run_.slides()[*slide];
      std::string name = slide_name(work.entry);
      try {
        if (!work.entry.value("complete", false))
          throw BadInput(work.store->path() + ": slide " + name + " is not completely tiled (run tessera tile again)");
        Message opened{Message::Kind::opened, *slide};
        opened.file = std::make_unique<FeatureFileWriter>(file_path(work), extractor_.layout(work.entry),
                                                          options_.overwrite ? Existing::overwrite : Existing::refuse);
        if (opened.file->complete()) {  // this slide's features, made as this run makes them
          run_.advance(work.entry.value("tiles", uint64_t{0}), name);
          run_.record(*slide, {{"slide", name}, {"file", file_path(work)}, {"status", "already complete"}});
          continue;
        }
        auto resumed_from = static_cast<uint64_t>(opened.file->rows());
        run_.advance(resumed_from, name);
        if (!tiles_.push(std::move(opened))) return;
        read_tiles(work, *slide, resumed_from);
        if (!tiles_.push({Message::Kind::read, *slide})) return;
      } catch (const ReaderStopped &) {
        return;
      } catch (const Error &e) {
        // A slide whose tiles cannot be read, or whose file another run writes (it is left to
        // that run) or has since filled with something else, fails alone; its partial file stays.
        bool in_use = dynamic_cast<const OutputInUse *>(&e) != nullptr;
        if (!in_use && e.code() != ExitCode::bad_input && e.code() != ExitCode::bad_usage) throw;
        Message failed{Message::Kind::failed, *slide};
        failed.error = e.what();
        failed.in_use = in_use;
        if (!tiles_.push(std::move(failed))) return;
      }
    }
    tiles_.close();
  }

  // Walks the slide's tiles in key order, decoding each batch on the worker threads.
  void read_tiles(const SlideWork &work, size_t slide, uint64_t skip) {
    struct Encoded {
      data::TileHeader header;
      std::vector<uint8_t> pixels;
      std::string where;
    };
    std::vector<Encoded> pending;
    const int tile_size = extractor_.tile_size();
    const size_t tile_bytes =
        static_cast<size_t>(tile_size) * static_cast<size_t>(tile_size) * static_cast<size_t>(extractor_.channels());
    auto emit = [&] {
      Message message{Message::Kind::batch, slide};
      TileBatch &batch = message.tiles;
      batch = {std::vector<uint8_t>(tile_bytes * static_cast<size_t>(options_.batch)), {},
               static_cast<int64_t>(pending.size())};
      std::exception_ptr failure;
      std::mutex failure_mutex;
      {
        std::vector<std::jthread> workers;
        for (int w = 0; w < options_.workers; ++w)
          workers.emplace_back([&, w] {
            for (size_t i = static_cast<size_t>(w); i < pending.size(); i += static_cast<size_t>(options_.workers)) {
              try {
                const Encoded &tile = pending[i];
                if (tile.header.width != tile_size || tile.header.height != tile_size)
                  throw BadInput(tile.where + ": tile is " + std::to_string(tile.header.width) + "x" +
                                 std::to_string(tile.header.height) + ", the slide's tile size is " +
                                 std::to_string(tile_size));
                data::decode_tile_pixels({tile.header, tile.pixels.data(), tile.pixels.size()},
                                         batch.rgb.data() + i * tile_bytes, tile.where);
              } catch (...) {
                std::lock_guard lock(failure_mutex);
                if (!failure) failure = std::current_exception();
              }
            }
          });
      }
      if (failure) std::rethrow_exception(failure);
      for (const Encoded &tile : pending) batch.coords.insert(batch.coords.end(), {tile.header.x, tile.header.y});
      pending.clear();
      if (!tiles_.push(std::move(message))) throw ReaderStopped{};
    };
    work.store->for_each_tile(work.id, skip, [&](const data::TileKey &key, const data::TileValue &value) {
      pending.push_back({value.header,
                         {value.pixels, value.pixels + value.pixel_bytes},
                         work.store->path() + " tile " + data::describe(key)});
      if (pending.size() == static_cast<size_t>(options_.batch)) emit();
    });
    if (!pending.empty()) emit();
  }

  void compute() {
    Message message;
    while (tiles_.pop(message)) {
      if (message.kind == Message::Kind::batch) message.features = extractor_.run(std::move(message.tiles));
      if (!features_.push(std::move(message))) return;
    }
    features_.close();
  }

  void write() {
    Message message;
    std::unique_ptr<FeatureFileWriter> file;
    Clock::time_point start;
    int64_t resumed_from = 0;
    double write_seconds = 0;
    while (features_.pop(message)) {
      const SlideWork &work = run_.slides()[message.slide];
      nlohmann::json summary = {{"slide", slide_name(work.entry)}, {"file", file_path(work)}, {"device", position_}};
      switch (message.kind) {
        case Message::Kind::opened:
          file = std::move(message.file);
          start = Clock::now();
          resumed_from = file->rows();
          write_seconds = 0;
          break;
        case Message::Kind::batch: {
          auto write_start = Clock::now();
          const FeatureBatch &batch = message.features;
          file->append(batch.features.data(), batch.coords.data(), batch.count);
          write_seconds += seconds_since(write_start);
          run_.advance(static_cast<uint64_t>(batch.count), slide_name(work.entry));
          break;
        }
        case Message::Kind::read: {
          int64_t rows = file->rows();
          file->finish();
          file.reset();
          write_seconds_ += write_seconds;
          slides_ += 1;
          tiles_extracted_ += static_cast<uint64_t>(rows - resumed_from);
          summary.update({{"status", resumed_from ? "resumed" : "extracted"},
                          {"tiles", rows},
                          {"resumed_from", resumed_from},
                          {"seconds", seconds_since(start)},
                          {"hdf5_write_seconds", write_seconds}});
          run_.record(message.slide, std::move(summary));
          break;
        }
        case Message::Kind::failed:
          file.reset();
          summary.update({{"status", message.in_use ? "in use" : "failed"}, {"error", message.error}});
          run_.record(message.slide, std::move(summary));
          break;
      }
    }
  }

  size_t position_;  // in --devices
  Extractor &extractor_;
  SharedRun &run_;
  const ExtractOptions &options_;
  // A few batches each way: the reader runs ahead of the device by at most this much.
  Channel<Message> tiles_{3}, features_{3};
  uint64_t slides_ = 0, tiles_extracted_ = 0;  // written by the writer thread, read after join
  double write_seconds_ = 0;
  std::vector<std::jthread> threads_;  // the last member: joined before the rest is destroyed
};

void create_out_directory(const std::string &out) {
  std::error_code error;
  fs::create_directories(out, error);
  if (error) throw Error(ExitCode::runtime_error, out + ": cannot create the directory: " + error.message());
}

}  // namespace

void extract_features(const ExtractOptions &options) {
  if (options.slides.empty() == options.tiles.empty()) throw UsageError("give either --slides or --tiles");
  if (options.batch < 1) throw UsageError("--batch must be at least 1");
  if (options.workers < 1) throw UsageError("--workers must be at least 1");
  // Checked before any work: --slides tiles first.
  std::vector<int> devices = options.devices.empty() ? std::vector<int>{options.device} : options.devices;
  if (!options.devices.empty()) vk::named_devices(options.devices, "--devices");
  const ResolvedModel model = resolve_model(options.model, 2);
  // A model per device, each planned and checked against its device's budget before any work.
  std::vector<std::unique_ptr<Extractor>> extractors;
  auto build_extractors = [&](int tile_size, int channels) {
    extractors.clear();
    for (int device : devices)
      extractors.push_back(std::make_unique<Extractor>(options, model, tile_size, channels, device));
  };
  nlohmann::json summary = nlohmann::json::object();
  std::vector<std::string> store_paths;
  data::Shard shard = options.shard;
  if (!options.slides.empty()) {
    // Each task of a job array tiles its shard into its own store: one writer per store.
    std::string name = shard.count == 1 ? "tiles.lmdb"
                                        : "tiles-" + std::to_string(shard.index) + "-of-" +
                                              std::to_string(shard.count) + ".lmdb";
    store_paths = {(fs::path(options.out) / name).string()};
    std::vector<data::SlideJob> jobs;
    for (size_t i : data::shard_members(options.slides, shard, "--slides")) jobs.push_back({options.slides[i], ""});
    if (!jobs.empty()) build_extractors(options.tiler.size, 3);  // rebuilt if the slides have other channels
    create_out_directory(options.out);
    summary["tiling"] = data::tile_slides(jobs, store_paths[0], options.tiler);
    shard = {};  // that store holds this shard's slides only
  } else {
    store_paths = data::find_tile_stores(options.tiles, "--tiles");
  }
  std::vector<std::unique_ptr<data::TileStoreReader>> stores;
  std::vector<SlideWork> all;
  for (const std::string &path : store_paths) {
    const auto &store = *stores.emplace_back(std::make_unique<data::TileStoreReader>(path));
    for (auto &[id, entry] : store.slides()) all.push_back({&store, id, entry});
  }
  if (all.empty() && options.shard.count == 1)
    throw BadInput(store_paths.front() + (store_paths.size() > 1 ? " and the others" : "") +
                                  ": holds no slides");
  std::vector<std::string> slide_paths;
  for (const SlideWork &work : all) slide_paths.push_back(work.entry.value("path", work.store->path()));
  std::vector<SlideWork> selected;
  std::map<std::string, std::string> written_by;  // feature file name -> the slide writing it
  for (size_t i : data::shard_members(slide_paths, shard, "--tiles")) {
    std::string name = slide_name(all[i].entry);
    if (auto [at, fresh] = written_by.emplace(name, slide_paths[i]); !fresh)
      throw UsageError("--tiles: slides " + at->second + " and " + slide_paths[i] + " would both write " + name +
                       ".h5");
    selected.push_back(all[i]);
  }
  summary["shard"] = {{"index", options.shard.index}, {"count", options.shard.count}, {"slides", selected.size()}};
  if (selected.empty()) {  // more tasks than slides: this one has nothing to do
    summary.update({{"slides", nlohmann::json::array()}, {"tiles", 0}});
    std::printf("%s\n", summary.dump().c_str());
    return;
  }
  int tile_size = selected.front().entry.value("tile_size", 0);
  int channels = selected.front().entry.value("channels", 3);
  uint64_t total = 0;
  for (const SlideWork &work : selected) {
    total += work.entry.value("tiles", uint64_t{0});
    if (work.entry.value("tile_size", 0) != tile_size)
      throw BadInput(work.store->path() + ": tiles of " + std::to_string(work.entry.value("tile_size", 0)) +
                     " pixels, other slides have " + std::to_string(tile_size) + ": one model input size per run");
    if (work.entry.value("channels", 3) != channels)
      throw BadInput(work.store->path() + ": slide " + slide_name(work.entry) + " has " +
                     std::to_string(work.entry.value("channels", 3)) + " channels, other slides " +
                     std::to_string(channels) + ": one model input per run");
  }

  if (extractors.empty() || extractors.front()->tile_size() != tile_size || extractors.front()->channels() != channels)
    build_extractors(tile_size, channels);
  create_out_directory(options.out);
  // Before any work: a file another slide or other settings made is not replaced unasked.
  for (const SlideWork &work : selected)
    check_feature_file_replaceable((fs::path(options.out) / (slide_name(work.entry) + ".h5")).string(),
                                   extractors.front()->layout(work.entry),
                                   options.overwrite ? Existing::overwrite : Existing::refuse);
  // Throughput counts from here: building the network and its pipelines is a fixed cost.
  auto start = Clock::now();
  SharedRun run(selected, total, extractors.size());
  std::vector<std::unique_ptr<DevicePipeline>> pipelines;
  for (size_t k = 0; k < extractors.size(); ++k)
    pipelines.push_back(std::make_unique<DevicePipeline>(k, *extractors[k], run, options));
  for (auto &pipeline : pipelines) pipeline->start();
  for (auto &pipeline : pipelines) pipeline->join();
  const std::vector<nlohmann::json> &per_slide = run.finish();
  double seconds = seconds_since(start);
  uint64_t extracted = 0, planned = 0, peak = 0;
  double device_seconds = 0, write_seconds = 0;
  nlohmann::json per_device = nlohmann::json::array();
  for (auto &pipeline : pipelines) {
    nlohmann::json report = pipeline->report();
    extracted += report["tiles"].get<uint64_t>();
    device_seconds += report["device_seconds"].get<double>();
    write_seconds += report["hdf5_write_seconds"].get<double>();
    planned = std::max(planned, report["planned_device_bytes"].get<uint64_t>());
    peak = std::max(peak, report["peak_device_bytes"].get<uint64_t>());
    per_device.push_back(std::move(report));
  }
  std::vector<std::string> failures, in_use;
  for (const nlohmann::json &slide : per_slide) {
    if (slide["status"] == "failed") failures.push_back(slide["error"]);
    if (slide["status"] == "in use") in_use.push_back(slide["error"]);
  }
  // Device seconds and write seconds add up over the devices; the device bytes are each device's.
  summary.update({{"extraction", extractors.front()->extraction()},
                  {"device", per_device.front()["name"]},
                  {"devices", per_device},
                  {"slides", per_slide},
                  {"tiles", extracted},
                  {"seconds", seconds},
                  {"features_per_second", seconds > 0 ? static_cast<double>(extracted) / seconds : 0.0},
                  {"device_seconds", device_seconds},
                  {"planned_device_bytes", planned},
                  {"peak_device_bytes", peak},
                  {"hdf5_write_seconds", write_seconds},
                  {"hdf5_write_share", seconds > 0 ? write_seconds / seconds : 0.0}});
  std::printf("%s\n", summary.dump().c_str());
  std::fflush(stdout);
  if (!failures.empty()) {
    std::string message = std::to_string(failures.size()) + " slide(s) failed (the others are complete):";
    for (auto &failure : failures) message += "\n  " + failure;
    throw BadInput(message);
  }
  if (!in_use.empty()) {
    std::string message = std::to_string(in_use.size()) +
                          " slide(s) were being written by another run, and were left to it (the others are "
                          "complete; run again once it ends):";
    for (auto &slide : in_use) message += "\n  " + slide;
    throw Error(ExitCode::runtime_error, message);
  }
}

}  // namespace tessera
