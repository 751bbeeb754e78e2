#include "data/loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "data/ordered_parallel.h"

namespace tessera::data {

void augment_patch(uint8_t* pixels, int size, uint64_t random_bits, int channels, bool rgb) {
  bool flip = random_bits & 1;
  int rotation = static_cast<int>((random_bits >> 1) & 3);
  // Brightness and contrast within +-10%, saturation within +-20%, as mild H&E stain variation.
  auto unit = [&](int shift) { return static_cast<float>((random_bits >> shift) & 0xff) / 255.0f * 2 - 1; };
  float brightness = 1 + 0.1f * unit(8), contrast = 1 + 0.1f * unit(16), saturation = 1 + 0.2f * unit(24);
  const auto samples = static_cast<size_t>(channels);
  const bool colour = rgb && channels == 3;  // saturation mixes the channels of a colour image only
  std::vector<uint8_t> source(pixels, pixels + static_cast<size_t>(size) * size * samples);
  for (int y = 0; y < size; ++y)
    for (int x = 0; x < size; ++x) {
      int sx = flip ? size - 1 - x : x, sy = y;
      for (int r = 0; r < rotation; ++r) {  // rotate the source coordinate by 90 degrees
        int t = sx;
        sx = sy;
        sy = size - 1 - t;
      }
      const uint8_t* from = &source[(static_cast<size_t>(sy) * size + sx) * samples];
      float grey = colour ? 0.299f * from[0] + 0.587f * from[1] + 0.114f * from[2] : 0.0f;
      uint8_t* to = pixels + (static_cast<size_t>(y) * size + x) * samples;
      for (int c = 0; c < channels; ++c) {
        float v = colour ? grey + saturation * (from[c] - grey) : static_cast<float>(from[c]);
        v = (v - 128.0f) * contrast + 128.0f;
        to[c] = static_cast<uint8_t>(std::clamp(v * brightness, 0.0f, 255.0f) + 0.5f);
      }
    }
}

Loader::Loader(const PatchSource& source, std::vector<size_t> indices, LoaderOptions options)
    : source_(source), indices_(std::move(indices)), options_(options) {}

Loader::~Loader() { stop(); }

size_t Loader::batches_per_epoch() const {
  size_t n = indices_.size(), b = options_.batch;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void Loader::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (producer_.joinable()) producer_.join();
  stopping_ = false;
  ready_.clear();
}

Batch Loader::make_batch(const std::vector<size_t>& order, size_t batch_index, uint32_t epoch) const {
  const size_t b = options_.batch,
               patch = static_cast<size_t>(source_.height()) * source_.width() * static_cast<size_t>(source_.channels());
  Batch batch;
  batch.images.assign(b * patch, 0);
  batch.labels.assign(b, 0);
  size_t first = batch_index * b;
  batch.count = std::min(b, order.size() - first);
  for (size_t i = 0; i < batch.count; ++i) {
    size_t index = order[first + i];
    bool decoded = i >= decoded_.first && i - decoded_.first < decoded_.count;
    batch.labels[i] = source_.read(index, decoded ? &batch.images[i * patch] : nullptr);
    if (decoded && options_.augment && source_.height() == source_.width()) {
      std::mt19937_64 generator(options_.seed * 0x9e3779b97f4a7c15ull + epoch * 0x632be59bd9b4e019ull + index);
      augment_patch(&batch.images[i * patch], source_.width(), generator(), source_.channels(), source_.rgb());
    }
  }
  return batch;
}

void Loader::start_epoch(uint32_t epoch) {
  stop();
  delivered_ = 0;
  total_ = batches_per_epoch();
  failure_ = nullptr;
  auto order = std::make_shared<std::vector<size_t>>(indices_);
  if (options_.shuffle) std::shuffle(order->begin(), order->end(), std::mt19937_64(options_.seed * 1000003ull + epoch));
  producer_ = std::thread([this, order, epoch] {
    try {
      ordered_parallel<Batch>(
          total_, std::max(1, options_.workers), options_.queue_depth + static_cast<size_t>(options_.workers),
          [&](size_t i) { return make_batch(*order, i, epoch); },
          [&](size_t, Batch&& batch) {
            std::unique_lock lock(mutex_);
            changed_.wait(lock, [&] { return stopping_ || ready_.size() < options_.queue_depth; });
            if (stopping_) throw std::runtime_error("loader stopped");
            ready_.push_back(std::move(batch));
            changed_.notify_all();
          });
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!stopping_) failure_ = std::current_exception();
      changed_.notify_all();
    }
  });
}

bool Loader::next(Batch& batch) {
  std::unique_lock lock(mutex_);
  if (delivered_ >= total_) return false;
  changed_.wait(lock, [&] { return !ready_.empty() || failure_; });
  if (ready_.empty() && failure_) std::rethrow_exception(failure_);
  batch = std::move(ready_.front());
  ready_.pop_front();
  ++delivered_;
  changed_.notify_all();
  return true;
}

}  // namespace tessera::data
