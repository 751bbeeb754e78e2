// The run's models on one device (jobs/extract.h): each the network up to its layer, or a patch
// encoder, over batches of tiles at its input size. Their plans are checked against the device's
// budget together before any work; they are held together where they fit, else loaded one at a
// time (DeviceModels::use).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/inference.h"
#include "compute/memory_plan.h"
#include "compute/vk/context.h"
#include "jobs/extract.h"
#include "jobs/extract_inputs.h"

namespace tessera {

// One model on one device.
class Extractor {
 public:
  // Plans the pass (nothing allocated): its batch is `batch` (--batch, or the one chosen for it:
  // chosen()), or less where a buffer would pass the device's largest (capped()).
  Extractor(const ExtractOptions &options, const ExtractModel &model, vk::Context &context, int64_t batch,
            nlohmann::json chosen = nullptr);
  ~Extractor();

  // Builds the model on the device (allocates, loads and prepares its weights, records its pass);
  // unload() gives the memory back.
  void load();
  void unload();
  bool loaded() const { return inference_ != nullptr; }

  const ExtractModel &model() const { return model_; }
  int64_t batch() const { return batch_; }
  // Why the batch is smaller than --batch (null: it is not).
  const nlohmann::json &capped() const { return capped_; }
  // How the batch was chosen without --batch (BatchChoice::to_json; null: --batch gave it).
  const nlohmann::json &chosen() const { return chosen_; }
  const MemoryPlan &plan() const { return plan_; }
  // The model's identity in its feature files (the weights' digest: known once loaded).
  const nlohmann::json &extraction() const { return extraction_; }
  int64_t width() const { return width_; }

  // Runs `count` (at most batch()) tiles of input_size x input_size x channels uint8 through the
  // model; returns count x width() pooled features. Loaded only.
  std::vector<float> run(const uint8_t *tiles, int64_t count);
  // Seconds in run() (upload, pass and download).
  double device_seconds() const { return device_seconds_; }

 private:
  const ExtractOptions &options_;
  const ExtractModel &model_;
  vk::Context &context_;
  InferenceOptions inference_options_;
  int64_t batch_ = 0;
  nlohmann::json capped_, chosen_;
  MemoryPlan plan_;
  std::unique_ptr<Inference> inference_;
  std::vector<float> output_;
  int64_t width_ = 0, spatial_ = 1;
  nlohmann::json extraction_;
  double device_seconds_ = 0;
};

class DeviceModels {
 public:
  // Plans every model on device `device` (an index, -1 the default) and checks them against its
  // budget: together where they fit (all loaded now), else each alone (loaded once now for its
  // weights' digest, then as use() asks). OutOfDeviceMemory (exit 3) naming the model when one
  // does not fit even alone.
  DeviceModels(const ExtractOptions &options, const std::vector<ExtractModel> &models, int device);

  size_t size() const { return extractors_.size(); }
  // Model `index` loaded (with only it loaded, when they are not held together).
  Extractor &use(size_t index);
  Extractor &at(size_t index) { return *extractors_[index]; }
  bool together() const { return together_; }
  vk::Context &context() { return context_; }
  // Why the models are not held together (null when they are).
  const nlohmann::json &one_at_a_time() const { return one_at_a_time_; }
  // The device, each model's batch and plan, the peak device memory.
  nlohmann::json report();

 private:
  vk::Context context_;
  std::vector<std::unique_ptr<Extractor>> extractors_;
  bool together_ = true;
  uint64_t planned_ = 0;  // the bytes checked against the budget
  nlohmann::json one_at_a_time_;
};

}  // namespace tessera
