// The batch of a run whose --batch is not given (train, extract): the largest that fits the
// device's memory budget with a margin, up to what still makes the device faster.
#pragma once
#include <cstdint>
#include <functional>

#include <nlohmann/json.hpp>

#include "compute/vk/context.h"

namespace tessera {

// The share of the budget a chosen batch's plan may take; the rest is the margin for what a plan
// does not count (the driver's own memory, a block the allocator cannot fill).
inline constexpr double chosen_batch_budget_share = 0.75;

// The largest batch worth choosing on `device` for samples of `pixels` pixels (a side squared).
// lavapipe (host_cores) spreads a batch over the host's cores: past about four 224 x 224 tiles a
// batch is no faster (bench/bench_batch.py, docs/architecture.md "Default batch") and only takes
// memory; smaller tiles get more of them, so that a dispatch's fixed cost stays small beside its
// work. A GPU fills its cores better with more: 64.
int64_t batch_speed_cap(const vk::DeviceInfo &device, int64_t pixels);

struct BatchChoice {
  int64_t batch = 1;
  int64_t speed_cap = 1;      // batch_speed_cap of the devices, or less where the run holds fewer
  uint64_t device_bytes = 0;  // the plan's at `batch`
  uint64_t budget_bytes = 0;  // what it was held within: the budget's share
  // As the run's settings print it.
  nlohmann::json to_json() const;
};

// The largest power of two from 1 to min(speed_cap, most) whose plan takes at most `budget_bytes`
// (device_bytes_at(batch): the device bytes of the run's plan at that batch); 1 where none does
// (the run's own check of its plan then fails, exit 3, naming what it holds).
BatchChoice choose_batch(int64_t speed_cap, int64_t most, uint64_t budget_bytes,
                         const std::function<uint64_t(int64_t)> &device_bytes_at);

}  // namespace tessera
