#include "compute/run_checks.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/error.h"

namespace tessera {

void check_finite_state(const std::map<std::string, HostArray>& params, const std::map<std::string, HostArray>& train,
                        int epoch) {
  for (auto* group : {&params, &train})
    for (auto& [name, array] : *group)
      for (float value : array.values)
        if (!std::isfinite(value))
          throw Diverged("training diverged: " + name + " holds " + (std::isnan(value) ? "NaN" : "an infinity") +
                         " after epoch " + std::to_string(epoch) +
                         " (try a lower --lr); the checkpoint keeps its last finite state");
}

nlohmann::json run_settings(const TrainOptions& options) {
  // The stores' order does not change the patches (they are ordered by slide content).
  std::vector<std::string> data;
  for (auto& path : options.data) {
    std::error_code error;
    data.push_back(std::filesystem::weakly_canonical(path, error).string());
  }
  std::sort(data.begin(), data.end());
  nlohmann::json settings = {{"data", data},
          {"model", options.model},
          {"width", options.width},
          {"batch", options.batch},
          {"accumulate", options.accumulate},
          {"optimizer", options.optimizer.kind},
          {"lr", options.optimizer.lr},
          {"momentum", options.optimizer.momentum},
          {"weight_decay", options.optimizer.weight_decay},
          {"seed", options.seed},
          {"val_fraction", options.val_fraction},
          {"class_weights", options.class_weights},
          {"augment", options.augment},
          {"precision", options.fp16 ? "fp16" : "fp32"}};
  settings.update(options.job_settings);
  return settings;
}

}  // namespace tessera
