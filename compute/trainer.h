// The training loop: a planned, budget-checked set of device tensors, whole steps recorded
// once into command buffers and replayed, checkpoints every epoch, exact resume.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/network.h"
#include "compute/optimizer.h"
#include "compute/vk/context.h"

namespace tessera {

struct TrainOptions {
  std::string data;
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
};

// Where training reports: JSON records for progress and for the trial protocol.
struct TrainReporting {
  std::function<void(const nlohmann::json&)> protocol;  // {"type":"intermediate"...}, {"type":"final"...}
  bool progress = true;                                 // bar or JSON lines on stderr
};

// Device bytes the run needs, by category; what --dry-run prints and what is checked against
// the budget before any work.
MemoryPlan plan_training(vk::Context& context, const TrainOptions& options);

// Throws OutOfDeviceMemory, with `advice` on what to change, when the plan and what is already
// allocated are over the budget.
void check_plan_fits(vk::Context& context, const MemoryPlan& plan, const std::string& advice);

// Runs training. Throws OutOfDeviceMemory (plan over budget), Diverged (non-finite loss),
// BadInput (data, checkpoint), UsageError (flags).
void train(vk::Context& context, const TrainOptions& options, const TrainReporting& reporting);

}  // namespace tessera
