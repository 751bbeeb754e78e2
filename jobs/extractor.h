// One device's model in an extraction (jobs/extract.h): the network up to the layer, or a patch
// encoder, over batches of staged tiles, and the feature file layout it writes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/feature_file.h"
#include "compute/inference.h"
#include "compute/vk/context.h"
#include "jobs/encoder_input.h"
#include "jobs/extract.h"

namespace tessera {

struct TileBatch {
  std::vector<uint8_t> rgb;     // batch x size x size x 3
  std::vector<int64_t> coords;  // count x 2, level-0 x, y
  int64_t count = 0;
};

struct FeatureBatch {
  std::vector<float> features;  // count x D
  std::vector<int64_t> coords;
  int64_t count = 0;
};

// The name of a tile store entry's slide: its file name without the extension.
std::string slide_name(const nlohmann::json &entry);

class Extractor {
 public:
  // An encoder reads RGB tiles resized to its input size, normalised its way, in fp16 where the
  // features are fp16; a CNN reads the store's tiles as they are, up to `options.layer`. The
  // batch is --batch, or less where a buffer would pass the device's largest (capped()).
  Extractor(const ExtractOptions &options, const ResolvedModel &model, int tile_size, int channels, int device,
            const EncoderInput *encoder);

  const nlohmann::json &extraction() const { return extraction_; }
  // The model's input size (the store's tiles are resized to it for an encoder).
  int tile_size() const { return tile_size_; }
  int channels() const { return channels_; }
  int64_t batch() const { return batch_; }
  // Why the batch is smaller than --batch (null: it is not).
  const nlohmann::json &capped() const { return capped_; }

  // The feature file of a slide (its tile store entry) as this model writes it.
  FeatureFileLayout layout(const nlohmann::json &entry) const;
  // Runs a batch of tiles through the network; rows are the pooled features.
  FeatureBatch run(TileBatch &&tiles);
  nlohmann::json report();

 private:
  const ExtractOptions &options_;
  int tile_size_, channels_;
  vk::Context context_;
  std::string encoder_;
  int64_t batch_ = 0;
  nlohmann::json capped_;
  std::unique_ptr<Inference> model_;
  std::vector<float> output_;
  int64_t width_ = 0, spatial_ = 1;
  nlohmann::json extraction_;
  double device_seconds_ = 0;
};


}  // namespace tessera
