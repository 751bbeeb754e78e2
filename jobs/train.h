// tessera train --data: a CNN on patches (a PCam-layout HDF5 file or an LMDB tile store),
// through the shared training loop (compute/trainer.h).
#pragma once
#include "compute/trainer.h"

namespace tessera {

// Device bytes the run needs, by category; what --dry-run prints and what is checked against
// the budget before any work.
MemoryPlan plan_training(vk::Context& context, const TrainOptions& options);

// Runs training. Throws OutOfDeviceMemory (plan over budget), Diverged (non-finite loss),
// BadInput (data, checkpoint), UsageError (flags).
void train(vk::Context& context, const TrainOptions& options, const TrainReporting& reporting);

}  // namespace tessera
