#include "jobs/batch_choice.h"

#include <algorithm>

#include "common/units.h"

namespace tessera {

int64_t batch_speed_cap(const vk::DeviceInfo &device, int64_t pixels) {
  if (!device.host_cores) return 64;
  constexpr int64_t enough_pixels = 4 * 224 * 224;
  return std::clamp<int64_t>(enough_pixels / std::max<int64_t>(pixels, 1), 4, 64);
}

nlohmann::json BatchChoice::to_json() const {
  return {{"batch", batch},
          {"chosen", true},
          {"speed_cap", speed_cap},
          {"planned_device_bytes", device_bytes},
          {"within_bytes", budget_bytes},
          {"why", "the largest batch (at most " + std::to_string(speed_cap) + " a device) whose plan (" + format_bytes(device_bytes) +
                      ") fits " + format_number(chosen_batch_budget_share * 100) + "% of the device's budget (" +
                      format_bytes(budget_bytes) + "); --batch sets it"}};
}

BatchChoice choose_batch(int64_t speed_cap, int64_t most, uint64_t budget_bytes,
                         const std::function<uint64_t(int64_t)> &device_bytes_at) {
  BatchChoice choice;
  choice.speed_cap = std::max<int64_t>(1, std::min(speed_cap, most));
  choice.budget_bytes = budget_bytes;
  int64_t batch = 1;
  while (batch * 2 <= choice.speed_cap) batch *= 2;
  // Plans grow with the batch: the first that fits, halving from the cap, is the largest.
  for (; batch > 1; batch /= 2)
    if (uint64_t bytes = device_bytes_at(batch); bytes <= budget_bytes) {
      choice.batch = batch;
      choice.device_bytes = bytes;
      return choice;
    }
  choice.batch = 1;
  choice.device_bytes = device_bytes_at(1);
  return choice;
}

}  // namespace tessera
