#include "jobs/extract.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/progress.h"
#include "compute/checkpoint.h"
#include "compute/feature_file.h"
#include "compute/hdf5.h"
#include "compute/network.h"
#include "data/tile_store.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A bounded queue between two threads. close() ends it after what is queued;
// fail() ends it at once and hands the error to the reader.
template <class T>
class Channel {
 public:
  explicit Channel(size_t capacity) : capacity_(capacity) {}
  // False when the channel was closed (the reader is gone): the writer stops.
  bool push(T &&item) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    changed_.notify_all();
    return true;
  }
  // False at the end; rethrows the writer's error.
  bool pop(T &item) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (failure_) std::rethrow_exception(failure_);
    if (items_.empty()) return false;
    item = std::move(items_.front());
    items_.pop_front();
    changed_.notify_all();
    return true;
  }
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    changed_.notify_all();
  }
  void fail(std::exception_ptr failure) {
    std::lock_guard lock(mutex_);
    failure_ = failure;
    closed_ = true;
    changed_.notify_all();
  }

 private:
  size_t capacity_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<T> items_;
  bool closed_ = false;
  std::exception_ptr failure_;
};

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

// Thrown inside the store's cursor walk when the device side has stopped
// reading.
struct ReaderStopped {};

nlohmann::json truncated_after(nlohmann::json description, const std::string &layer) {
  auto &layers = description["layers"];
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i]["name"] == layer) {
      layers.erase(layers.begin() + static_cast<std::ptrdiff_t>(i) + 1, layers.end());
      break;
    }
  return description;
}

std::string slide_name(const nlohmann::json &entry) {
  return fs::path(entry.value("name", entry.value("path", ""))).stem().string();
}

class Extractor {
 public:
  Extractor(const ExtractOptions &options, int tile_size)
      : options_(options), tile_size_(tile_size), context_(context_options(options)) {
    nlohmann::json description;
    std::optional<Checkpoint> checkpoint;
    if (is_checkpoint_path(options.model)) {
      checkpoint = read_checkpoint(options.model);
      description = expand_presets(checkpoint->model);
    } else {
      description = load_model_description(options.model, 2);
    }
    // uint8 RGB as read from the store becomes the layer the model reads as "input".
    std::vector<GraphInput> inputs{{"images", {options.batch, tile_size, tile_size, 3}, DType::u8}};
    nlohmann::json prologue = nlohmann::json::array({{{"name", "input"}, {"type", "input_normalize"}, {"inputs", {"images"}}}});
    // The whole graph resolves the name (a module's output is its last
    // sublayer's); only the layers up to it run.
    std::string layer = Network(description, inputs, false, prologue).layer(options.layer).name;
    network_ = std::make_unique<Network>(truncated_after(description, layer), inputs, false, prologue);
    // The graph's buffers (in inference an activation's is handed on once read), the staged
    // images and the step count.
    auto &allocator = context_.allocator();
    planned_bytes_ = network_->plan(allocator).total() +
                     allocator.footprint(static_cast<uint64_t>(element_count(inputs[0].shape))) +
                     InferenceProgram::planned_bytes(allocator);
    network_->allocate(context_);
    network_->initialise(0);
    if (checkpoint) {
      std::map<std::string, Tensor *> tensors;
      for (auto &named : network_->named_tensors()) tensors[named.name] = named.tensor;
      load_tensors(checkpoint->params, tensors, options.model, "params");
    }
    const Shape &out = network_->output_shape();
    width_ = out[1];
    spatial_ = element_count(out) / (out[0] * out[1]);
    extraction_ = {{"model", options.model},
                   {"layer", layer},
                   {"output_shape", Shape(out.begin() + 1, out.end())},
                   {"pooling", out.size() > 2 ? "global_average" : "none"},
                   {"precision", options.fp16 ? "fp16" : "fp32"},
                   {"tile_size", tile_size}};

    images_ = std::make_unique<Tensor>(context_, "images", inputs[0].shape, DType::u8, vk::MemoryUsage::staging);
    program_ = std::make_unique<InferenceProgram>(context_, *network_, Network::Bound{{"images", images_.get()}});
    output_.resize(static_cast<size_t>(element_count(out)));
  }

  const nlohmann::json &extraction() const { return extraction_; }
  const std::string &device_name() const { return context_.info().name; }

  // Runs a batch of tiles through the network; rows are the pooled features.
  FeatureBatch run(TileBatch &&tiles) {
    auto start = Clock::now();
    std::memcpy(images_->buffer().mapped(), tiles.rgb.data(), tiles.rgb.size());
    program_->run();
    network_->output().download(output_.data(), output_.size() * sizeof(float));
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

  nlohmann::json extract_slide(const data::TileStoreReader &store, uint32_t id, const nlohmann::json &entry,
                               Progress &progress, uint64_t &done) {
    std::string name = slide_name(entry);
    fs::path path = fs::path(options_.out) / (name + ".h5");
    nlohmann::json summary = {{"slide", name}, {"file", path.string()}};
    if (fs::exists(path)) {
      summary["status"] = "already complete";
      done += entry.value("tiles", uint64_t{0});
      return summary;
    }
    if (!entry.value("complete", false))
      throw BadInput(store.path() + ": slide " + name + " is not completely tiled (run tessera tile again)");
    FeatureFileLayout layout{name,
                             tile_size_,
                             entry.value("level", int64_t{0}),
                             entry.value("downsample", 1.0),
                             entry.value("level_width", int64_t{0}),
                             entry.value("level_height", int64_t{0}),
                             width_,
                             options_.fp16,
                             options_.gzip,
                             extraction_};
    FeatureFileWriter file(path.string(), layout);
    int64_t resumed_from = file.rows();
    done += static_cast<uint64_t>(resumed_from);
    auto start = Clock::now();
    double write_seconds = 0;

    Channel<TileBatch> tiles(3);
    Channel<FeatureBatch> features(3);
    std::exception_ptr write_failure;
    std::jthread reader([&] {
      try {
        read_tiles(store, id, static_cast<uint64_t>(resumed_from), tiles);
        tiles.close();
      } catch (const ReaderStopped &) {
      } catch (...) {
        tiles.fail(std::current_exception());
      }
    });
    std::jthread writer([&] {
      try {
        FeatureBatch batch;
        while (features.pop(batch)) {
          auto write_start = Clock::now();
          file.append(batch.features.data(), batch.coords.data(), batch.count);
          write_seconds += seconds_since(write_start);
        }
      } catch (...) {
        write_failure = std::current_exception();
        features.close();
      }
    });
    try {
      TileBatch batch;
      while (tiles.pop(batch)) {
        int64_t count = batch.count;
        if (!features.push(run(std::move(batch)))) break;
        done += static_cast<uint64_t>(count);
        progress.update(done, {{"slide", name}});
      }
    } catch (...) {
      tiles.close();
      features.close();
      throw;
    }
    // The writer may have stopped first (a full disk): release a reader waiting to hand over tiles.
    tiles.close();
    features.close();
    writer.join();
    if (write_failure) std::rethrow_exception(write_failure);
    int64_t rows = file.rows();
    file.finish();
    double seconds = seconds_since(start);
    write_seconds_ += write_seconds;
    summary.update({{"status", resumed_from ? "resumed" : "extracted"},
                    {"tiles", rows},
                    {"resumed_from", resumed_from},
                    {"seconds", seconds},
                    {"hdf5_write_seconds", write_seconds}});
    return summary;
  }

  double device_seconds() const { return device_seconds_; }
  uint64_t planned_bytes() const { return planned_bytes_; }
  uint64_t peak_bytes() { return context_.allocator().stats().peak_bytes; }
  double write_seconds() const { return write_seconds_; }

 private:
  static vk::ContextOptions context_options(const ExtractOptions &options) {
    vk::ContextOptions context = vk::options_from_environment();
    context.device_index = options.device;
    return context;
  }

  // Walks the slide's tiles in key order, decoding each batch on the worker
  // threads.
  void read_tiles(const data::TileStoreReader &store, uint32_t id, uint64_t skip, Channel<TileBatch> &out) const {
    struct Encoded {
      data::TileHeader header;
      std::vector<uint8_t> pixels;
      std::string where;
    };
    std::vector<Encoded> pending;
    const size_t tile_bytes = static_cast<size_t>(tile_size_) * static_cast<size_t>(tile_size_) * 3;
    auto emit = [&] {
      TileBatch batch{std::vector<uint8_t>(tile_bytes * static_cast<size_t>(options_.batch)),
                      {},
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
                if (tile.header.width != tile_size_ || tile.header.height != tile_size_)
                  throw BadInput(tile.where + ": tile is " + std::to_string(tile.header.width) + "x" +
                                 std::to_string(tile.header.height) + ", the slide's tile size is " +
                                 std::to_string(tile_size_));
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
      if (!out.push(std::move(batch))) throw ReaderStopped{};
    };
    store.for_each_tile(id, skip, [&](const data::TileKey &key, const data::TileValue &value) {
      pending.push_back({value.header,
                         {value.pixels, value.pixels + value.pixel_bytes},
                         store.path() + " tile " + data::describe(key)});
      if (pending.size() == static_cast<size_t>(options_.batch)) emit();
    });
    if (!pending.empty()) emit();
  }

  const ExtractOptions &options_;
  int tile_size_;
  vk::Context context_;
  std::unique_ptr<Network> network_;
  std::unique_ptr<Tensor> images_;
  std::unique_ptr<InferenceProgram> program_;
  std::vector<float> output_;
  int64_t width_ = 0, spatial_ = 1;
  nlohmann::json extraction_;
  double device_seconds_ = 0, write_seconds_ = 0;
  uint64_t planned_bytes_ = 0;
};

}  // namespace

void extract_features(const ExtractOptions &options) {
  // A feature file that the disk refused to flush cannot be closed; HDF5's exit handler would then
  // crash closing it again. Its flushed rows are known (FeatureFileWriter::rows), so skip that handler.
  H5dont_atexit();
  if (options.slides.empty() == options.tiles.empty()) throw UsageError("give either --slides or --tiles");
  if (options.batch < 1) throw UsageError("--batch must be at least 1");
  if (options.workers < 1) throw UsageError("--workers must be at least 1");
  std::error_code error;
  fs::create_directories(options.out, error);
  if (error) throw Error(ExitCode::runtime_error, options.out + ": cannot create the directory: " + error.message());
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
    summary["tiling"] = data::tile_slides(jobs, store_paths[0], options.tiler);
    shard = {};  // that store holds this shard's slides only
  } else {
    store_paths = data::find_tile_stores(options.tiles, "--tiles");
  }
  struct SlideWork {
    const data::TileStoreReader *store;
    uint32_t id;
    nlohmann::json entry;
  };
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
  uint64_t total = 0;
  for (const SlideWork &work : selected) {
    total += work.entry.value("tiles", uint64_t{0});
    if (work.entry.value("tile_size", 0) != tile_size)
      throw BadInput(work.store->path() + ": tiles of " + std::to_string(work.entry.value("tile_size", 0)) +
                     " pixels, other slides have " + std::to_string(tile_size) + ": one model input size per run");
  }

  Extractor extractor(options, tile_size);
  for (const SlideWork &work : selected)
    if (auto done = fs::path(options.out) / (slide_name(work.entry) + ".h5"); fs::exists(done))
      check_same_extraction(done.string(), extractor.extraction());
  // Throughput counts from here: building the network and its pipelines is a fixed cost.
  auto start = Clock::now();
  Progress progress("extract", total);
  uint64_t done = 0, extracted = 0;
  std::vector<std::string> failures;
  nlohmann::json per_slide = nlohmann::json::array();
  for (const auto &[store, id, entry] : selected) {
    try {
      auto result = extractor.extract_slide(*store, id, entry, progress, done);
      if (result["status"] != "already complete")
        extracted += result["tiles"].get<uint64_t>() - result["resumed_from"].get<uint64_t>();
      per_slide.push_back(result);
    } catch (const BadInput &e) {
      // A slide whose tiles cannot be read fails alone; its partial file stays
      // for a later run.
      progress.event({{"error", e.what()}, {"slide", slide_name(entry)}});
      per_slide.push_back({{"slide", slide_name(entry)}, {"status", "failed"}, {"error", e.what()}});
      failures.push_back(e.what());
    }
  }
  progress.finish();
  double seconds = seconds_since(start);
  summary.update({{"extraction", extractor.extraction()},
                  {"device", extractor.device_name()},
                  {"slides", per_slide},
                  {"tiles", extracted},
                  {"seconds", seconds},
                  {"features_per_second", seconds > 0 ? static_cast<double>(extracted) / seconds : 0.0},
                  {"device_seconds", extractor.device_seconds()},
                  {"planned_device_bytes", extractor.planned_bytes()},
                  {"peak_device_bytes", extractor.peak_bytes()},
                  {"hdf5_write_seconds", extractor.write_seconds()},
                  {"hdf5_write_share", seconds > 0 ? extractor.write_seconds() / seconds : 0.0}});
  std::printf("%s\n", summary.dump().c_str());
  std::fflush(stdout);
  if (!failures.empty()) {
    std::string message = std::to_string(failures.size()) + " slide(s) failed (the others are complete):";
    for (auto &failure : failures) message += "\n  " + failure;
    throw BadInput(message);
  }
}

}  // namespace tessera
