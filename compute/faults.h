// Test-only faults (TESSERA_FAULT) for the sweep's and the trainer's tests: a run that leaks
// device memory, crashes, hangs, runs out of memory, diverges, is killed after an epoch, or
// starts its loss scale high, each through the real code path. Read once per training run.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "compute/vk/context.h"

namespace tessera {

struct Faults {
  // TESSERA_FAULT, or no fault when it is unset; throws UsageError naming a value that is not a fault.
  static Faults from_environment();

  std::optional<uint64_t> leak_bytes;     // leak:BYTES, device memory never freed
  bool segfault = false, hang = false, oom = false;
  std::optional<std::string> wait;        // wait:DIR (compute/release_wait.h)
  // nan: the model's last parameter filled with NaN (""), nan:TENSOR that named tensor.
  std::optional<std::string> nan_tensor;
  std::optional<int> sigkill_epoch;       // sigkill:EPOCH[:RANK], once that epoch is checkpointed
  int sigkill_rank = -1;                  // only that MPI rank's process; -1: any
  std::optional<float> loss_scale;        // loss_scale:VALUE, the scale a mixed-precision run starts from

  // Before training, on each device: leak, segfault, hang, oom, wait.
  void before_training(vk::Context& context) const;
  // After epoch `epochs_done` is checkpointed on MPI rank `rank`: sigkill.
  void after_epoch(int epochs_done, int rank) const;
};

}  // namespace tessera
