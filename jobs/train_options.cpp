#include "jobs/train_options.h"

#include <algorithm>
#include <filesystem>

namespace tessera {

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

LoopSettings loop_settings(const TrainOptions& options) {
  return {options.epochs,        options.accumulate, options.optimizer, options.seed, options.class_weights,
          options.checkpoint,    options.fp16,       options.sync_batch_norm};
}

}  // namespace tessera
