#include "jobs/extract.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
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
#include "compute/vk/context.h"
#include "data/resize.h"
#include "data/tile_store.h"
#include "jobs/channel.h"
#include "jobs/encoder_input.h"
#include "jobs/extract_plan.h"
#include "jobs/extractor.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

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

struct SlideWork {
  const data::TileStoreReader *store;
  uint32_t id;
  nlohmann::json entry;
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

  // A line of its own (a warning).
  void event(const nlohmann::json &record) {
    std::lock_guard lock(mutex_);
    progress_.event(record);
  }

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

  // Walks the slide's tiles in key order, decoding each batch on the worker threads (and resizing
  // them to the model's input, for an encoder).
  void read_tiles(const SlideWork &work, size_t slide, uint64_t skip) {
    struct Encoded {
      data::TileHeader header;
      std::vector<uint8_t> pixels;
      std::string where;
    };
    std::vector<Encoded> pending;
    const int tile_size = work.entry.value("tile_size", 0), input_size = extractor_.tile_size();
    const size_t tile_bytes = static_cast<size_t>(input_size) * static_cast<size_t>(input_size) *
                              static_cast<size_t>(extractor_.channels());
    const auto batch_size = static_cast<size_t>(extractor_.batch());
    auto emit = [&] {
      Message message{Message::Kind::batch, slide};
      TileBatch &batch = message.tiles;
      batch = {std::vector<uint8_t>(tile_bytes * batch_size), {},
               static_cast<int64_t>(pending.size())};
      std::exception_ptr failure;
      std::mutex failure_mutex;
      {
        std::vector<std::jthread> workers;
        for (int w = 0; w < options_.workers; ++w)
          workers.emplace_back([&, w] {
            // An encoder's tiles (RGB) are decoded here and resized into the batch.
            std::vector<uint8_t> decoded(tile_size == input_size ? 0 : size_t{3} * tile_size * tile_size);
            for (size_t i = static_cast<size_t>(w); i < pending.size(); i += static_cast<size_t>(options_.workers)) {
              try {
                const Encoded &tile = pending[i];
                if (tile.header.width != tile_size || tile.header.height != tile_size)
                  throw BadInput(tile.where + ": tile is " + std::to_string(tile.header.width) + "x" +
                                 std::to_string(tile.header.height) + ", the slide's tile size is " +
                                 std::to_string(tile_size));
                uint8_t *rgb = batch.rgb.data() + i * tile_bytes;
                data::decode_tile_pixels({tile.header, tile.pixels.data(), tile.pixels.size()},
                                         decoded.empty() ? rgb : decoded.data(), tile.where);
                if (!decoded.empty())
                  data::resize_rgb_box(decoded.data(), tile_size, tile_size, rgb, input_size, input_size);
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
      if (pending.size() == batch_size) emit();
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
  if (options.slides.empty() == options.tiles.empty() && !options.dry_run)
    throw UsageError("give either --slides or --tiles");
  if (options.batch < 1) throw UsageError("--batch must be at least 1");
  if (options.workers < 1) throw UsageError("--workers must be at least 1");
  // Checked before any work: --slides tiles first.
  std::vector<int> devices = options.devices.empty() ? std::vector<int>{options.device} : options.devices;
  if (!options.devices.empty()) vk::named_devices(options.devices, "--devices");
  const ResolvedModel model = resolve_model(options.model, 2, options.encoder);
  std::optional<EncoderInput> encoder;
  if (!options.encoder.empty()) encoder = encoder_input(options.encoder);
  if (options.dry_run) return print_extraction_plans(options, model, encoder ? &*encoder : nullptr, devices);
  // A model per device, each planned and checked against its device's budget before any work.
  std::vector<std::unique_ptr<Extractor>> extractors;
  auto build_extractors = [&](int tile_size, int channels) {
    extractors.clear();
    for (int device : devices)
      extractors.push_back(std::make_unique<Extractor>(options, model, tile_size, channels, device,
                                                       encoder ? &*encoder : nullptr));
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
    if (encoder) {  // each slide at the level and tile size that give the encoder's magnification
      summary["tiling"] = nlohmann::json::array();
      for (const TilingGroup &group : encoder_tiling(jobs, options.tiler, options.mpp, *encoder))
        summary["tiling"].push_back(data::tile_slides(group.jobs, store_paths[0], group.options));
    } else {
      summary["tiling"] = data::tile_slides(jobs, store_paths[0], options.tiler);
    }
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
  bool rgb = data::slide_entry_rgb(selected.front().entry);
  uint64_t total = 0;
  for (const SlideWork &work : selected) {
    total += work.entry.value("tiles", uint64_t{0});
    if (encoder) {  // RGB tiles of any size, resized to the encoder's input
      check_tiles_fit_encoder(work.store->path(), work.entry, options.mpp, *encoder);
    } else if (work.entry.value("tile_size", 0) != tile_size) {
      throw BadInput(work.store->path() + ": tiles of " + std::to_string(work.entry.value("tile_size", 0)) +
                     " pixels, other slides have " + std::to_string(tile_size) + ": one model input size per run");
    }
    int slide_channels = work.entry.value("channels", 3);
    bool slide_rgb = data::slide_entry_rgb(work.entry);
    if (slide_channels != channels || slide_rgb != rgb)
      throw BadInput(work.store->path() + ": slide " + slide_name(work.entry) + " has " +
                     data::channels_in_words(slide_channels, slide_rgb) + ", other slides " +
                     data::channels_in_words(channels, rgb) + ": one model input per run");
  }

  if (encoder && !rgb)
    throw BadInput(selected.front().store->path() + ": slide " + slide_name(selected.front().entry) + " has " +
                   data::channels_in_words(channels, rgb) + "; encoder " + encoder->name + " reads RGB tiles");
  if (extractors.empty() || (!encoder && extractors.front()->tile_size() != tile_size) ||
      extractors.front()->channels() != channels)
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
  for (auto &extractor : extractors)
    if (!extractor->capped().is_null()) run.event(extractor->capped());
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
