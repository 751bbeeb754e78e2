// How an extraction moves through a device: a reader thread that takes the next slide, opens
// every model's feature file of it and reads its tiles on worker threads (data/tile_batches.h)
// into batches at each model's input size, a few batches ahead; a device thread that runs each
// model over each batch; and a writer thread that appends each model's features to its file and
// finishes the slide. Slides go to whichever device takes them next; each is one device's work
// from start to end.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/progress.h"
#include "common/run_report.h"
#include "data/tile_batches.h"
#include "jobs/channel.h"
#include "jobs/extract_inputs.h"
#include "jobs/extractor.h"

namespace tessera {

// Where a slide's time went, summed over its tiles and batches (thread seconds).
struct SlideTimes {
  double read_seconds = 0;    // reading and decoding tiles, on the workers
  double resize_seconds = 0;  // shrinking them to the models' inputs, on the workers
  double device_seconds = 0;  // the models' passes, uploads and downloads
  double wait_seconds = 0;    // the device waiting for a batch
  double device_wall_seconds = 0;  // the device's thread on the slide, first message to last: busy = device / this
  double write_seconds = 0;   // appending to the feature files
  uint64_t decoded = 0;       // tiles read and decoded (once for every model that reads them there)
  SlideTimes &operator+=(const SlideTimes &other);
  nlohmann::json to_json() const;
};

// What moves from a device's reader through the device to its writer, in a slide's order.
struct PipelineMessage {
  enum class Kind {
    opened,    // the slide's feature files, by model (null where complete)
    batch,     // tiles of one of the slide's reads (reader -> device)
    features,  // one model's rows (device -> writer)
    read,      // the slide read to its end
    failed,    // it cannot be read, or another run writes its files
  } kind = Kind::batch;
  size_t slide = 0;
  std::vector<std::unique_ptr<FeatureFileWriter>> files;
  size_t read = 0;                 // batch: which of the slide's reads
  data::TileBatch tiles;           // batch
  std::vector<int64_t> rows_done;  // batch: by model, the rows its file holds already
  size_t model = 0;                // features
  int64_t first_row = 0;           // features
  std::vector<float> features;     // features: rows x D
  std::vector<int64_t> coords;     // features: rows x 2
  SlideTimes times;
  std::string error;    // failed
  bool in_use = false;  // failed: another run holds a file of the slide
};

// What the devices share: the slides, the next one nobody has taken, the progress, each slide's
// summary (in the slides' order, whichever device made it), and an error that ends the run.
class SharedRun {
 public:
  // `observer` (may be null) is told each slide as it is recorded.
  SharedRun(const ExtractInputs &inputs, const ExtractOptions &options, size_t devices, SlideObserver *observer);

  const ExtractInputs &inputs() const { return inputs_; }
  const ExtractOptions &options() const { return options_; }

  // Device k's first slide is slide k, so that every device has work whenever there are as many
  // slides; later, the next slide nobody has taken. Nothing once all are taken or the run halts.
  std::optional<size_t> take_first(size_t device) { return checked(device); }
  std::optional<size_t> take() { return checked(next_++); }

  // No slide is taken after this one (a slide that cannot be read, without --skip-errors); what
  // is in flight finishes.
  void halt() { halted_ = true; }
  // Ends the run at once: every queue stops and `error` reaches finish().
  void fail(std::exception_ptr error);
  void watch(Channel<PipelineMessage> &channel);

  void event(const nlohmann::json &record);
  // `tiles` more of `slide` extracted (the progress bar's fields).
  void advance(uint64_t tiles, const std::string &slide);
  void record(size_t slide, nlohmann::json summary, const SlideTimes &times);

  // After every thread has ended: the slides' summaries (those in flight when an error ended the
  // run "interrupted", those never taken "not started") and their times summed, and the error.
  const std::vector<nlohmann::json> &finish(SlideTimes &total, std::exception_ptr &error);

 private:
  std::optional<size_t> checked(size_t slide);  // marks it taken

  const ExtractInputs &inputs_;
  const ExtractOptions &options_;
  SlideObserver *observer_;
  std::atomic<size_t> next_;
  std::atomic<bool> halted_{false};
  std::mutex mutex_;  // guards what follows
  std::vector<nlohmann::json> summaries_;
  std::vector<bool> taken_;
  SlideTimes total_;
  Progress progress_;
  uint64_t recorded_ = 0, tiles_ = 0;  // slides recorded, tiles extracted
  std::exception_ptr error_;
  std::vector<Channel<PipelineMessage> *> channels_;
};

class DevicePipeline {
 public:
  DevicePipeline(size_t position, DeviceModels &models, SharedRun &run, int workers);
  void start();
  void join() { threads_.clear(); }
  // The device's report, with the slides and tiles it extracted and its busy and waiting seconds.
  nlohmann::json report();

 private:
  void read();
  bool open_files(size_t slide, std::vector<std::unique_ptr<FeatureFileWriter>> &files, std::vector<int64_t> &rows,
                  int64_t &complete_rows);
  void read_tiles(size_t slide, size_t read, const std::vector<int64_t> &rows, SlideTimes &times,
                  std::map<double, std::optional<data::TissueMask>> &masks);
  void compute();
  void run_models(std::vector<PipelineMessage> &batches);
  void write();

  size_t position_;  // in --devices
  DeviceModels &models_;
  SharedRun &run_;
  int workers_;
  // A few batches each way: the reader runs ahead of the device by at most this much.
  Channel<PipelineMessage> tiles_{3}, features_{8};
  uint64_t slides_ = 0, tiles_extracted_ = 0;  // written by the writer thread, read after join
  double write_seconds_ = 0, wait_seconds_ = 0;
  std::vector<std::jthread> threads_;  // the last member: joined before the rest is destroyed
};

}  // namespace tessera
