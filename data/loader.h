// The training loader: batches of patches decoded and augmented on worker threads, in a
// seeded order, through a bounded queue (Caffe's prefetching data layer, over any PatchSource).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "data/patches.h"

namespace tessera::data {

struct Batch {
  std::vector<uint8_t> images;    // count x height x width x channels (RGB: 3)
  std::vector<uint32_t> labels;   // count
  size_t count = 0;               // real patches; the rest of a fixed-size batch is padding
};

struct LoaderOptions {
  size_t batch = 32;
  bool shuffle = true;
  bool drop_last = true;   // training drops the incomplete last batch; evaluation pads it
  bool augment = false;    // flips, 90-degree rotations and colour jitter
  uint64_t seed = 0;
  int workers = 2;
  size_t queue_depth = 4;  // ready batches held at most
};

// The samples of each batch whose pixels are read; the others get their labels and zero pixels
// (an MPI process of data-parallel training decodes only the part its devices take).
struct DecodedPart {
  size_t first = 0, count = SIZE_MAX;
};

class Loader {
 public:
  Loader(const PatchSource& source, std::vector<size_t> indices, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  size_t batches_per_epoch() const;
  // From the next start_epoch on, reads the pixels of `part` of each batch only.
  void decode_only(DecodedPart part) { decoded_ = part; }
  // Starts producing the batches of `epoch` (its order is a function of seed and epoch alone,
  // so a resumed run sees the same batches).
  void start_epoch(uint32_t epoch);
  // The next batch of the epoch; false when the epoch is over. Rethrows a reader's error.
  bool next(Batch& batch);

 private:
  void stop();
  Batch make_batch(const std::vector<size_t>& order, size_t batch_index, uint32_t epoch) const;

  const PatchSource& source_;
  std::vector<size_t> indices_;
  LoaderOptions options_;
  DecodedPart decoded_;
  std::thread producer_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;
  size_t delivered_ = 0, total_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
};

// Applies a flip, a rotation by a multiple of 90 degrees and a colour jitter, all chosen from
// `random_bits`, to a square patch of `channels` samples a pixel in place (the jitter's saturation
// part only to RGB; planes, 3 of them too, take its brightness and contrast alone).
void augment_patch(uint8_t* pixels, int size, uint64_t random_bits, int channels = 3, bool rgb = true);

}  // namespace tessera::data
