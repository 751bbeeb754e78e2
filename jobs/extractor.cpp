#include "jobs/extractor.h"

#include <chrono>

#include "common/units.h"
#include "jobs/extract_plan.h"

namespace tessera {

Extractor::Extractor(const ExtractOptions &options, const ExtractModel &model, vk::Context &context, int64_t batch,
                     nlohmann::json chosen)
    : options_(options), model_(model), context_(context),
      inference_options_(extraction_inference(options, model)), chosen_(std::move(chosen)) {
  if (inference_options_.activations == DType::f16) require_fp16_storage(context_.info(), "extract");
  if (inference_options_.weights == DType::f16) require_fp16_storage(context_.info(), "extract", "--weights");
  inference_options_.inputs[0].shape[0] = batch;
  batch_ = capped_batch(model.resolved, inference_options_, context_.info(), batch, capped_);
  inference_options_.inputs[0].shape[0] = batch_;
  plan_ = plan_inference(context_, model.resolved, inference_options_);
}

Extractor::~Extractor() = default;

void Extractor::load() {
  if (inference_) return;
  inference_ = std::make_unique<Inference>(context_, model_.resolved, inference_options_);
  const Shape &out = inference_->output_shape();
  width_ = out[1];
  spatial_ = element_count(out) / (out[0] * out[1]);
  output_.resize(static_cast<size_t>(element_count(out)));
  extraction_ = {{"model", model_.weights.empty() && model_.encoder ? "random weights" : model_.weights},
                 {"weights", inference_->weights_digest()},
                 {"random_weights", !model_.resolved.checkpoint && model_.resolved.safetensors.empty()},
                 {"layer", inference_->layer()},
                 {"output_shape", Shape(out.begin() + 1, out.end())},
                 {"pooling", out.size() > 2 ? "global_average" : "none"},
                 {"precision", options_.fp16 ? "fp16" : "fp32"},
                 {"tile_size", model_.input_size}};
  // Files made with float weights keep the identity they always had.
  if (inference_options_.weights == DType::f16) extraction_["weight_precision"] = "fp16";
  if (model_.encoder) extraction_.update(model_.encoder->describe());
  if (model_.channels != 3) extraction_["channels"] = model_.channels;  // RGB files keep the settings they always had
}

void Extractor::unload() { inference_.reset(); }

std::vector<float> Extractor::run(const uint8_t *tiles, int64_t count) {
  auto start = std::chrono::steady_clock::now();
  const Tensor &input = inference_->input("images");
  const auto tile_bytes = static_cast<uint64_t>(model_.input_size) * static_cast<uint64_t>(model_.input_size) *
                          static_cast<uint64_t>(model_.channels);
  input.upload(tiles, tile_bytes * static_cast<uint64_t>(count));
  inference_->run();
  const int64_t values = count * width_ * spatial_;
  if (inference_->output().dtype() == DType::f16)
    output_ = inference_->output().download();
  else
    inference_->output().download(output_.data(), static_cast<uint64_t>(values) * sizeof(float));
  std::vector<float> features(static_cast<size_t>(count * width_));
  for (int64_t row = 0; row < count * width_; ++row) {
    const float *map = output_.data() + row * spatial_;
    double sum = 0;
    for (int64_t i = 0; i < spatial_; ++i) sum += map[i];
    features[static_cast<size_t>(row)] = static_cast<float>(sum / static_cast<double>(spatial_));
  }
  device_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return features;
}

DeviceModels::DeviceModels(const ExtractOptions &options, const std::vector<ExtractModel> &models, int device)
    : context_(extraction_context(options, device)) {
  MemoryPlan together;
  const uint64_t budget = context_.allocator().stats().budget_bytes;
  for (const ExtractModel &model : models) {
    int64_t batch = options.batch;
    nlohmann::json chosen;
    if (batch == 0) {  // no --batch: each model's share of the budget, so that they fit together
      const BatchChoice choice = chosen_extraction_batch(options, model, context_, budget / models.size());
      batch = choice.batch;
      chosen = choice.to_json();
    }
    together.append(
        extractors_.emplace_back(std::make_unique<Extractor>(options, model, context_, batch, chosen))->plan());
  }
  const uint64_t needed = together.device_bytes(context_.allocator());
  together_ = needed <= budget;
  planned_ = together_ ? together.total() : 0;
  if (!together_) {
    for (auto &extractor : extractors_) {
      check_plan_fits(context_, extractor->plan(), "lower --batch, or raise --device-memory-limit");
      planned_ = std::max(planned_, extractor->plan().total());
    }
    one_at_a_time_ = {{"warning", "the " + std::to_string(models.size()) + " models need " + format_bytes(needed) +
                                      " together on " + context_.info().name + ", over its budget of " +
                                      format_bytes(budget) + ": each runs alone over a chunk of tiles in turn"},
                      {"device", context_.info().index},
                      {"needed_bytes", needed},
                      {"budget_bytes", budget}};
  }
  // Each model is loaded once here, so that its weights' digest names its feature files before
  // any is opened; held together, they stay loaded.
  for (auto &extractor : extractors_) {
    extractor->load();
    if (!together_) extractor->unload();
  }
}

Extractor &DeviceModels::use(size_t index) {
  Extractor &wanted = *extractors_.at(index);
  if (!together_ && !wanted.loaded()) {
    for (auto &extractor : extractors_) extractor->unload();
    wanted.load();
  }
  return wanted;
}

nlohmann::json DeviceModels::report() {
  nlohmann::json models = nlohmann::json::array();
  double device_seconds = 0;
  for (auto &extractor : extractors_) {
    device_seconds += extractor->device_seconds();
    models.push_back({{"model", extractor->model().name},
                      {"batch", extractor->batch()},
                      {"batch_capped", extractor->capped()},
                      {"batch_chosen", extractor->chosen()},
                      {"planned_device_bytes", extractor->plan().total()},
                      {"stream_groups", extractor->plan().streaming.groups},
                      {"streamed_bytes", extractor->plan().streaming.streamed_bytes},
                      {"device_seconds", extractor->device_seconds()}});
  }
  return {{"index", context_.info().index},
          {"name", context_.info().name},
          {"type", context_.info().type},
          {"driver", context_.info().driver},
          {"device_seconds", device_seconds},
          {"batch", extractors_.front()->batch()},
          {"batch_capped", extractors_.front()->capped()},
          {"batch_chosen", extractors_.front()->chosen()},
          {"models", models},
          {"models_together", together_},
          {"planned_device_bytes", planned_},
          {"peak_device_bytes", context_.allocator().stats().peak_bytes}};
}

}  // namespace tessera
