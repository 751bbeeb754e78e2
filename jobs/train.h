// tessera train --data: a CNN on patches (a PCam-layout HDF5 file or an LMDB tile store),
// through the shared training loop (compute/trainer.h).
#pragma once
#include "compute/trainer.h"
#include "jobs/train_options.h"

namespace tessera {

// Device bytes the run needs on each device, by category; what --dry-run prints and what is
// checked against each device's budget before any work.
// Without --batch (options.batch 0), at the batch chosen for the devices (jobs/batch_choice.h).
std::vector<MemoryPlan> plan_training(const std::vector<vk::Context*>& devices, TrainOptions options);

// Runs training, data-parallel over several devices (and the processes of an MPI job; see
// compute/trainer.h). Throws OutOfDeviceMemory (plan over budget), Diverged (non-finite loss),
// BadInput (data, checkpoint), UsageError (flags).
void train(const std::vector<vk::Context*>& devices, TrainOptions options, const TrainReporting& reporting);

}  // namespace tessera
