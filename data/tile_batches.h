// The data path of extraction: a slide's tiles read (and decoded) on worker threads straight
// into batches at each model's input size (shrunk by resize.h's box filter where the tile is
// larger), handed on in order, a bounded number of batches ahead of whoever consumes them, so
// that memory does not grow with the slide.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "data/tile_source.h"

namespace tessera::data {

// Tiles [first, first + count) of a source, at every input size asked for.
struct TileBatch {
  size_t first = 0, count = 0;
  std::vector<TileOrigin> origins;  // count
  // By input size: capacity x size x size x channels uint8 (the batch's tiles first; the rest of
  // the capacity is left as it was).
  std::map<int, std::vector<uint8_t>> pixels;
  // Thread seconds summed over the batch's tiles: reading and decoding, and resizing.
  double read_seconds = 0, resize_seconds = 0;
};

struct BatchReading {
  size_t first = 0;            // the tile to start from (a resumed slide)
  size_t capacity = 1;         // tiles a batch
  std::vector<int> input_sizes;  // distinct; each at least 1
  int workers = 1;
  size_t ahead = 2;  // batches read ahead of the consumer, besides the one it holds
};

// Reads tiles [reading.first, source.size()) of `source` on `reading.workers` threads and calls
// consume(batch) on this thread for each batch in order; stops early when consume returns false.
// A tile that cannot be read throws its BadInput here (naming the slide and the tile), after the
// workers have stopped; so does an exception from consume. At most ahead + 1 batches are being
// read at once, whatever the slide's size. Resizing needs RGB tiles (3 channels).
void read_batches(const TileSource& source, const BatchReading& reading,
                  const std::function<bool(TileBatch&&)>& consume);

}  // namespace tessera::data
