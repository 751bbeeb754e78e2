// Loader throughput: patches per second decoded and augmented by data::Loader, against plain
// reads of the same patches through the PatchSource on one thread. Prints one JSON object.
// Usage: bench_loader STORE [--batch 64] [--workers 2] [--epochs 2]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include <nlohmann/json.hpp>

#include "data/loader.h"

using namespace tessera;

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s STORE|PATCHES.h5 [--batch B] [--workers W] [--epochs E]\n", argv[0]);
    return 2;
  }
  size_t batch = 64;
  int workers = 2, epochs = 2;
  for (int a = 2; a + 1 < argc; a += 2) {
    if (!std::strcmp(argv[a], "--batch")) batch = std::strtoul(argv[a + 1], nullptr, 10);
    if (!std::strcmp(argv[a], "--workers")) workers = std::atoi(argv[a + 1]);
    if (!std::strcmp(argv[a], "--epochs")) epochs = std::atoi(argv[a + 1]);
  }
  auto source = data::open_patches(argv[1]);
  std::vector<size_t> indices(source->size());
  std::iota(indices.begin(), indices.end(), 0);
  std::vector<uint8_t> pixels(static_cast<size_t>(source->height()) * source->width() * 3);

  auto start = std::chrono::steady_clock::now();
  for (size_t i : indices) source->read(i, pixels.data());
  double plain = static_cast<double>(indices.size()) / seconds_since(start);

  nlohmann::json result = {{"source", source->description()}, {"patches", source->size()},
                           {"patch", {source->height(), source->width()}}, {"plain_reads_per_second", plain}};
  for (bool augment : {false, true}) {
    data::LoaderOptions options{batch, true, true, augment, 1, workers, 4};
    data::Loader loader(*source, indices, options);
    data::Batch b;
    size_t patches = 0;
    start = std::chrono::steady_clock::now();
    for (int e = 0; e < epochs; ++e) {
      loader.start_epoch(static_cast<uint32_t>(e));
      while (loader.next(b)) patches += b.count;
    }
    result[augment ? "loader_augmented_per_second" : "loader_per_second"] =
        static_cast<double>(patches) / seconds_since(start);
  }
  result["workers"] = workers;
  result["batch"] = batch;
  std::printf("%s\n", result.dump(2).c_str());
  return 0;
}
