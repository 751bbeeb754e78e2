#include "jobs/extractor.h"

#include <chrono>
#include <filesystem>

#include "jobs/extract_plan.h"

namespace tessera {

std::string slide_name(const nlohmann::json &entry) {
  return std::filesystem::path(entry.value("name", entry.value("path", ""))).stem().string();
}

Extractor::Extractor(const ExtractOptions &options, const ResolvedModel &model, int tile_size, int channels,
                     int device, const EncoderInput *encoder)
    : options_(options), tile_size_(encoder ? encoder->image_size : tile_size), channels_(channels),
      context_(extraction_context(options, device)), encoder_(encoder ? encoder->name : "") {
  InferenceOptions inference = extraction_inference(options, tile_size_, channels, encoder);
  if (inference.activations == DType::f16) require_fp16_storage(context_.info(), "extract --precision fp16");
  batch_ = capped_batch(model, inference, context_.info(), options.batch, capped_);
  inference.inputs[0].shape[0] = batch_;
  model_ = std::make_unique<Inference>(context_, model, inference);
  const Shape &out = model_->output_shape();
  width_ = out[1];
  spatial_ = element_count(out) / (out[0] * out[1]);
  extraction_ = {{"model", encoder && options.model.empty() ? "random weights" : options.model},
                 {"weights", model_->weights_digest()},
                 {"random_weights", !model.checkpoint},
                 {"layer", model_->layer()},
                 {"output_shape", Shape(out.begin() + 1, out.end())},
                 {"pooling", out.size() > 2 ? "global_average" : "none"},
                 {"precision", options.fp16 ? "fp16" : "fp32"},
                 {"tile_size", tile_size_}};
  if (encoder) extraction_.update(encoder->describe());
  if (channels != 3) extraction_["channels"] = channels;  // RGB files keep the settings they always had
  output_.resize(static_cast<size_t>(element_count(out)));
}

FeatureFileLayout Extractor::layout(const nlohmann::json &entry) const {
  return {slide_name(entry),
          entry.value("tile_size", tile_size_),
          entry.value("level", int64_t{0}),
          entry.value("downsample", 1.0),
          entry.value("level_width", int64_t{0}),
          entry.value("level_height", int64_t{0}),
          width_,
          options_.fp16,
          options_.gzip,
          extraction_,
          {{"path", entry.value("path", "")},
           {"fingerprint", entry.value("fingerprint", "")},
           {"settings", entry.value("settings", nlohmann::json())},
           {"tiles", entry.value("tiles", 0)}},
          entry.value("width", int64_t{0}),
          entry.value("height", int64_t{0}),
          // An encoder's slide without its own pixel size was read at --mpp's.
          entry.value("mpp_x", 0.0) > 0 || encoder_.empty() ? entry.value("mpp_x", 0.0) : options_.mpp,
          encoder_.empty() ? extraction_.value("model", "") + ":" + extraction_.value("layer", "") : encoder_,
          static_cast<double>(tile_size_) / entry.value("tile_size", tile_size_)};
}

FeatureBatch Extractor::run(TileBatch &&tiles) {
  auto start = std::chrono::steady_clock::now();
  model_->input("images").upload(tiles.rgb.data(), tiles.rgb.size());
  model_->run();
  if (model_->output().dtype() == DType::f16)
    output_ = model_->output().download();
  else
    model_->output().download(output_.data(), output_.size() * sizeof(float));
  FeatureBatch batch{std::vector<float>(static_cast<size_t>(tiles.count * width_)), std::move(tiles.coords),
                     tiles.count};
  for (int64_t row = 0; row < tiles.count * width_; ++row) {
    const float *map = output_.data() + row * spatial_;
    double sum = 0;
    for (int64_t i = 0; i < spatial_; ++i) sum += map[i];
    batch.features[static_cast<size_t>(row)] = static_cast<float>(sum / static_cast<double>(spatial_));
  }
  device_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return batch;
}

nlohmann::json Extractor::report() {
  return {{"index", context_.info().index},
          {"name", context_.info().name},
          {"device_seconds", device_seconds_},
          {"batch", batch_},
          {"batch_capped", capped_},
          {"planned_device_bytes", model_->plan().total()},
          {"peak_device_bytes", context_.allocator().stats().peak_bytes}};
}

}  // namespace tessera
