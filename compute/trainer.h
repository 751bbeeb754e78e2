// The training loop that every job shares (patches for a CNN, slides as bags of features for
// a head): one graph (the job's layers, the model, the loss), planned and budget-checked
// before anything is allocated, whole steps recorded once into command buffers and replayed,
// metrics summed on the device, checkpoints every epoch, exact resume. It knows nothing of
// where the batches come from: a job hands it a Feed (compute/training_job.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compute/checkpoint.h"
#include "compute/memory_plan.h"
#include "compute/training_job.h"
#include "compute/vk/context.h"

namespace tessera {

class TrainingLoop {
 public:
  TrainingLoop(vk::Context& context, const LoopSettings& settings, TrainingJob job);
  // Data-parallel: one replica of the model per device (a device may be opened twice), times
  // the processes of an MPI job (compute/replica_group.h). Each micro-batch is split over the
  // replicas, their gradients are summed, and each replica runs the same update, so a step
  // equals one device's step on the whole batch (batch norm uses each replica's own samples).
  TrainingLoop(const std::vector<vk::Context*>& devices, const LoopSettings& settings, TrainingJob job);
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
  // The parameters as trained, by name (what a checkpoint's params hold), read back from the
  // first replica after run(): cross-validation scores a fold's slides with them.
  std::map<std::string, HostArray> parameters() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tessera
