#include "compute/run_checks.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "common/error.h"

namespace tessera {

namespace {

// 0.1 as "0.1", as the user wrote it.
std::string number(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

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

void check_labels_fit(const data::PatchSource& source, int64_t classes, const std::string& data) {
  if (source.class_count() > static_cast<uint64_t>(classes))
    throw BadInput(data + ": holds label " + std::to_string(source.class_count() - 1) + ", but the model has " +
                   std::to_string(classes) + " classes (labels must be in [0, " + std::to_string(classes) + "))");
}

nlohmann::json run_settings(const TrainOptions& options) {
  std::error_code error;
  std::string data = options.data.empty() ? "" : std::filesystem::weakly_canonical(options.data, error).string();
  return {{"data", data},
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
          {"augment", options.augment}};
}

void check_training_patches(const data::PatchSource& source, const TrainOptions& options, size_t train_patches,
                            size_t val_patches) {
  size_t per_step = static_cast<size_t>(options.batch) * static_cast<size_t>(options.accumulate);
  if (train_patches >= per_step) return;
  std::string need = "--batch " + std::to_string(options.batch) + " x --accumulate " +
                     std::to_string(options.accumulate) + " needs " + std::to_string(per_step) + " training patches";
  if (train_patches == 0 && val_patches > 0)
    throw UsageError(need + ", but validation (--val-fraction " + number(options.val_fraction) + ") took all " +
                     std::to_string(val_patches) + " patches of " + options.data +
                     " (whole slides go to one side: a store of one slide cannot be split); use --val-fraction 0, "
                     "or tile more slides");
  throw UsageError(need + "; " + options.data + " has " + std::to_string(train_patches) + " for training (" +
                   std::to_string(val_patches) + " held out for validation of " + std::to_string(source.size()) +
                   "): lower --batch or --val-fraction");
}

}  // namespace tessera
