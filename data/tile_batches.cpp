#include "data/tile_batches.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "common/error.h"
#include "data/resize.h"

namespace tessera::data {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The batches being read: a ring of ahead + 1 slots, batch b in slot b % size; a slot is handed
// to the consumer once all its tiles are in.
class BatchRing {
 public:
  BatchRing(const TileSource& source, const BatchReading& reading)
      : source_(source), reading_(reading), slots_(reading.ahead + 1), tiles_(source.size() - reading.first) {
    for (int size : reading.input_sizes)
      tile_bytes_[size] = size_t(size) * size_t(size) * static_cast<size_t>(source.record().channels);
  }

  // The next tile a worker should read (relative to `first`), or nothing when all are claimed, the
  // window is full until the consumer takes a batch, or the reading has stopped.
  std::optional<size_t> claim() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] {
      return stopped_ || next_claim_ >= tiles_ || next_claim_ / reading_.capacity < next_handed_ + slots_.size();
    });
    if (stopped_ || next_claim_ >= tiles_) return std::nullopt;
    size_t tile = next_claim_++;
    Slot& slot = slots_[(tile / reading_.capacity) % slots_.size()];
    if (tile % reading_.capacity == 0) prepare(slot, tile);
    return tile;
  }

  // Where tile `tile` goes, for the worker that claimed it (the slot stays until it is complete).
  TileBatch& batch_of(size_t tile) { return slots_[(tile / reading_.capacity) % slots_.size()].batch; }
  size_t position(size_t tile) const { return tile % reading_.capacity; }
  size_t tile_bytes(int size) const { return tile_bytes_.at(size); }

  void done(size_t tile, double read_seconds, double resize_seconds) {
    std::lock_guard lock(mutex_);
    Slot& slot = slots_[(tile / reading_.capacity) % slots_.size()];
    slot.batch.read_seconds += read_seconds;
    slot.batch.resize_seconds += resize_seconds;
    --slot.missing;
    changed_.notify_all();
  }

  void fail(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = error;
    stopped_ = true;
    changed_.notify_all();
  }

  // The next batch in order once it is complete; nothing at the end or once stopped.
  std::optional<TileBatch> next() {
    std::unique_lock lock(mutex_);
    size_t batches = (tiles_ + reading_.capacity - 1) / reading_.capacity;
    if (next_handed_ >= batches) return std::nullopt;
    Slot& slot = slots_[next_handed_ % slots_.size()];
    changed_.wait(lock, [&] { return stopped_ || (slot.prepared == next_handed_ && slot.missing == 0); });
    if (stopped_) return std::nullopt;
    TileBatch batch = std::move(slot.batch);
    slot.prepared = SIZE_MAX;
    ++next_handed_;
    changed_.notify_all();
    return batch;
  }

  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    changed_.notify_all();
  }

  std::exception_ptr error() {
    std::lock_guard lock(mutex_);
    return error_;
  }

 private:
  struct Slot {
    TileBatch batch;
    size_t prepared = SIZE_MAX;  // the batch the slot holds
    size_t missing = 0;          // its tiles not read yet
  };

  // Called under the lock by the worker that claims a batch's first tile.
  void prepare(Slot& slot, size_t tile) {
    TileBatch& batch = slot.batch;
    batch.first = reading_.first + tile;
    batch.count = std::min(reading_.capacity, tiles_ - tile);
    batch.origins.resize(batch.count);
    for (size_t i = 0; i < batch.count; ++i) batch.origins[i] = source_.origin(batch.first + i);
    for (auto& [size, bytes] : tile_bytes_) batch.pixels[size].resize(bytes * reading_.capacity);
    batch.read_seconds = batch.resize_seconds = 0;
    slot.prepared = tile / reading_.capacity;
    slot.missing = batch.count;
  }

  const TileSource& source_;
  const BatchReading& reading_;
  std::vector<Slot> slots_;
  std::map<int, size_t> tile_bytes_;
  const size_t tiles_;
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t next_claim_ = 0, next_handed_ = 0;
  bool stopped_ = false;
  std::exception_ptr error_;
};

}  // namespace

void read_batches(const TileSource& source, const BatchReading& reading,
                  const std::function<bool(TileBatch&&)>& consume) {
  if (reading.first >= source.size()) return;
  const SlideRecord& record = source.record();
  const int tile_size = record.tile_size;
  for (int size : reading.input_sizes)
    if (size != tile_size && record.channels != 3)
      throw BadInput(record.path + ": its tiles have " + std::to_string(record.channels) + " channels; only RGB " +
                     "tiles are resized (" + std::to_string(tile_size) + " to " + std::to_string(size) + " pixels)");
  BatchRing ring(source, reading);
  auto work = [&] {
    // A tile read at its own size where no input takes it as it is.
    std::vector<uint8_t> scratch;
    try {
      while (std::optional<size_t> tile = ring.claim()) {
        TileBatch& batch = ring.batch_of(*tile);
        const size_t position = ring.position(*tile);
        auto pixels_at = [&](int size) { return batch.pixels.at(size).data() + position * ring.tile_bytes(size); };
        auto start = Clock::now();
        uint8_t* read_into = batch.pixels.count(tile_size) ? pixels_at(tile_size) : nullptr;
        if (!read_into) {
          scratch.resize(size_t(tile_size) * size_t(tile_size) * static_cast<size_t>(record.channels));
          read_into = scratch.data();
        }
        source.read(reading.first + *tile, read_into);
        double read_seconds = seconds_since(start);
        start = Clock::now();
        for (int size : reading.input_sizes)
          if (size != tile_size) resize_rgb_box(read_into, tile_size, tile_size, pixels_at(size), size, size);
        ring.done(*tile, read_seconds, seconds_since(start));
      }
    } catch (...) {
      ring.fail(std::current_exception());
    }
  };
  std::vector<std::jthread> workers;
  for (int w = 0; w < std::max(1, reading.workers); ++w) workers.emplace_back(work);
  try {
    while (std::optional<TileBatch> batch = ring.next())
      if (!consume(std::move(*batch))) break;
  } catch (...) {
    ring.fail(std::current_exception());
  }
  ring.stop();
  workers.clear();  // joined
  if (std::exception_ptr error = ring.error()) std::rethrow_exception(error);
}

}  // namespace tessera::data
