// The training loop that every job shares (patches for a CNN, slides as bags of features for
// a head): one graph (the job's layers, the model, the loss), planned and budget-checked
// before anything is allocated, whole steps recorded once into command buffers and replayed,
// metrics summed on the device, checkpoints every epoch, exact resume. It knows nothing of
// where the batches come from: a job hands it a Feed.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/checkpoint.h"
#include "compute/network.h"
#include "compute/optimizer.h"
#include "compute/vk/context.h"

namespace tessera {

struct TrainOptions {
  std::vector<std::string> data;  // a PCam-layout HDF5 file, or tile stores / a directory of them
  std::string model = "small-cnn";  // preset, model JSON, or checkpoint .h5 to start from
  int width = 32;                   // channel width of small-cnn
  int epochs = 1;
  int batch = 32;                   // the micro-batch that runs on the device at once
  int accumulate = 1;               // micro-batches per optimizer step
  OptimizerConfig optimizer;
  uint32_t seed = 0;
  double val_fraction = 0.1;
  std::vector<float> class_weights;
  bool augment = false;
  int workers = 2;
  std::string checkpoint;
  bool resume = false;
  bool dry_run = false;
  // Settings of the job's own flags that a resumed run must share, by name (a slide-level
  // head's features, labels and head); saved beside run_settings' in the checkpoint.
  nlohmann::json job_settings = nlohmann::json::object();
  // --precision fp16: activations and their gradients in fp16, dynamic loss scaling
  // (loss_scale.h); parameters, gradients and optimizer state stay float.
  bool fp16 = false;
  // --sync-bn: batch norm statistics over every replica's samples (PyTorch's SyncBatchNorm)
  // rather than each replica's own; no effect on one device.
  bool sync_batch_norm = false;
};

// Where training reports: JSON records for progress and for the trial protocol.
struct TrainReporting {
  std::function<void(const nlohmann::json&)> protocol;  // {"type":"intermediate"...}, {"type":"final"...}
  bool progress = true;                                 // bar or JSON lines on stderr
};

// A job's batches as the loop sees them, in an order fixed by the seed and the epoch alone
// (so that a resumed run sees the same batches).
class Feed {
 public:
  virtual ~Feed() = default;
  virtual size_t batches_per_epoch() const = 0;
  virtual void start_epoch(uint32_t epoch) = 0;
  // Writes the next batch into the host-visible tensors of the job's staged inputs, by name;
  // false when the epoch is over.
  virtual bool next(const std::map<std::string, const Tensor*>& staged) = 0;
  // Only samples [first, first + count) of each batch will be computed here (an MPI process's
  // part): a feed may leave the others' inputs other than their labels unread.
  virtual void compute_only(int64_t first, int64_t count) {
    (void)first;
    (void)count;
  }
};

// What a job hands the loop.
struct TrainingJob {
  nlohmann::json model;  // the description saved in checkpoints (a graph, or a head's fields)
  nlohmann::json graph;  // the model as a graph of layers
  // Layers before the model (the normalisation of uint8 images into the layer "input").
  nlohmann::json prologue = nlohmann::json::array();
  // Written by the Feed for every micro-batch: what the graph reads, and "labels" u32 [N]
  // and "valid" u32 [1] (how many of the N samples are real) for the loss and the metrics.
  std::vector<GraphInput> staged;
  std::optional<Checkpoint> start;  // --resume, or weights to start from (its `train` empty)
  std::string start_path;           // the file `start` came from, for messages
  nlohmann::json report = nlohmann::json::object();  // added to every epoch record
  std::string advice;  // what to change when the plan is over the budget
};

class TrainingLoop {
 public:
  TrainingLoop(vk::Context& context, const TrainOptions& options, TrainingJob job);
  // Data-parallel: one replica of the model per device (a device may be opened twice), times
  // the processes of an MPI job (compute/data_parallel.h). Each micro-batch is split over the
  // replicas, their gradients are summed, and each replica runs the same update, so a step
  // equals one device's step on the whole batch (batch norm uses each replica's own samples).
  TrainingLoop(const std::vector<vk::Context*>& devices, const TrainOptions& options, TrainingJob job);
  ~TrainingLoop();
  // Device bytes the run needs on each device, by category: what --dry-run prints and what is
  // checked against each device's budget before any work.
  std::vector<MemoryPlan> plans() const;
  MemoryPlan plan() const { return plans().front(); }
  // The model's outputs: the classes its labels must lie in.
  int64_t classes() const;
  // Checks the plan against the budget, allocates, initialises (from the seed or `start`),
  // records the programs and trains. Throws OutOfDeviceMemory (plan over budget), Diverged
  // (non-finite loss), BadInput (checkpoint), UsageError (flags).
  void run(Feed& train, Feed& validation, const TrainReporting& reporting);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tessera
