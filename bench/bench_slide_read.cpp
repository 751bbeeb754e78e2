// The data path of extraction alone, no device: a slide's tissue tiles read at an encoder's
// magnification (data::read_at_magnification), shrunk to its input size and, in the consumer,
// normalised to float32 CHW with ImageNet's mean and std, as TRIDENT's DataLoader hands its
// encoder torch tensors (in tessera the device normalises; this is bench code, for a like-for-like
// figure). Prints one JSON line; bench/bench_slide_read.py runs it beside TRIDENT's way.
// Usage: bench_slide_read SLIDE [--workers N] [--tiles K] [--batch 32] [--mpp 0.5] [--image-size 224]
//        [--coords-out FILE]
#include <sys/resource.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/slide.h"
#include "data/slide_record.h"
#include "data/tile_batches.h"
#include "data/tile_source.h"
#include "data/tiler.h"

using namespace tessera;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// User and system seconds of every thread of this process.
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// torchvision's ToTensor() then Normalize(ImageNet): (v / 255 - mean) / std in float32, per channel,
// tabulated for the 256 byte values (the same float operations, so the same floats).
class ImageNetNormaliser {
 public:
  ImageNetNormaliser() {
    constexpr std::array<float, 3> mean{0.485f, 0.456f, 0.406f}, deviation{0.229f, 0.224f, 0.225f};
    for (int channel = 0; channel < 3; ++channel)
      for (int value = 0; value < 256; ++value)
        table_[channel][value] = (static_cast<float>(value) / 255.0f - mean[channel]) / deviation[channel];
  }

  // `count` HWC uint8 RGB tiles of size x size into `planes`, [count, 3, size, size] float32.
  void operator()(const uint8_t* pixels, size_t count, int size, std::vector<float>& planes) const {
    const size_t area = static_cast<size_t>(size) * static_cast<size_t>(size);
    planes.resize(count * 3 * area);
    for (size_t tile = 0; tile < count; ++tile) {
      const uint8_t* in = pixels + tile * area * 3;
      float* red = planes.data() + tile * 3 * area;
      float* green = red + area;
      float* blue = green + area;
      for (size_t i = 0; i < area; ++i) {
        red[i] = table_[0][in[3 * i]];
        green[i] = table_[1][in[3 * i + 1]];
        blue[i] = table_[2][in[3 * i + 2]];
      }
    }
  }

 private:
  std::array<std::array<float, 256>, 3> table_{};
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tiles/s of tessera's data path (slide to normalised encoder input, no device); one JSON line"};
  std::string slide_path, coords_out;
  int workers = 1, image_size = 224;
  size_t tiles_limit = 0, batch_size = 32;
  double model_mpp = 0.5;
  app.add_option("SLIDE", slide_path, "Slide to read")->required();
  app.add_option("--workers", workers, "Threads reading, decoding and resizing tiles")->check(CLI::Range(1, 1024));
  app.add_option("--tiles", tiles_limit, "Read only the first K tissue tiles (0: all)");
  app.add_option("--batch", batch_size, "Tiles a batch")->check(CLI::Range(1, 4096));
  app.add_option("--mpp", model_mpp, "Microns per pixel the encoder was trained at (20x: 0.5)");
  app.add_option("--image-size", image_size, "Encoder input side in pixels")->check(CLI::Range(1, 4096));
  app.add_option("--coords-out", coords_out, "Write the level-0 x,y of every tile read, one a line");
  CLI11_PARSE(app, argc, argv);

  try {
    std::shared_ptr<const data::Slide> slide = data::open_slide(slide_path);
    std::vector<double> downsamples;
    for (const data::SlideLevel& level : slide->levels()) downsamples.push_back(level.downsample);
    if (slide->mpp_x() <= 0) throw BadInput(slide_path + ": the file gives no microns per pixel");
    const data::MagnificationRead read =
        data::read_at_magnification(slide_path, downsamples, slide->mpp_x(), model_mpp, image_size, "the encoder");
    const data::SlideLevel& level = slide->levels()[static_cast<size_t>(read.level)];

    auto setup_start = Clock::now();
    const data::TilerOptions tiling;  // tile's defaults: automatic stain, half the tile tissue
    std::optional<data::TissueMask> mask = data::find_tissue(*slide, read.read_size * level.downsample, tiling);
    data::TileGrid grid = data::tissue_grid(*slide, read.level, read.read_size, mask ? &*mask : nullptr,
                                            tiling.min_tissue);
    if (tiles_limit > 0 && grid.kept.size() > tiles_limit) grid.kept.resize(tiles_limit);
    data::SlideRecord record = data::describe_slide(*slide, slide_path, "", read.level, read.read_size, {});
    auto source = data::live_grid_tiles(slide, record, std::move(grid), mask ? &*mask : nullptr);
    const double setup_seconds = seconds_since(setup_start);
    if (source->size() <= batch_size)
      throw BadInput(slide_path + ": " + std::to_string(source->size()) + " tissue tiles, not more than one batch of " +
                     std::to_string(batch_size) + " (the first batch is the warm-up)");

    if (!coords_out.empty()) {
      std::ofstream coords(coords_out);
      for (size_t i = 0; i < source->size(); ++i) coords << source->origin(i).x << ',' << source->origin(i).y << '\n';
      if (!coords) throw BadInput(coords_out + ": cannot write the coordinates");
    }

    data::BatchReading reading;
    reading.capacity = batch_size;
    reading.input_sizes = {image_size};
    reading.workers = workers;
    const ImageNetNormaliser normalise;
    std::vector<float> planes;
    // The first batch is the warm-up: the clock and the stage sums start once it is normalised.
    size_t batches = 0, timed_tiles = 0;
    double read_seconds = 0, resize_seconds = 0, normalise_seconds = 0, timed_cpu_start = 0;
    Clock::time_point timed_start;
    double checksum = 0;  // keeps the normalised planes live
    data::read_batches(*source, reading, [&](data::TileBatch&& batch) {
      auto normalise_start = Clock::now();
      normalise(batch.pixels.at(image_size).data(), batch.count, image_size, planes);
      checksum += planes[planes.size() / 2];
      if (batches++ == 0) {
        timed_start = Clock::now();
        timed_cpu_start = process_cpu_seconds();
        return true;
      }
      normalise_seconds += seconds_since(normalise_start);
      read_seconds += batch.read_seconds;
      resize_seconds += batch.resize_seconds;
      timed_tiles += batch.count;
      return true;
    });
    const double seconds = seconds_since(timed_start);
    const double cpu_seconds = process_cpu_seconds() - timed_cpu_start;

    nlohmann::json result = {
        {"slide", slide_path},
        {"format", slide->format()},
        {"mpp", slide->mpp_x()},
        {"level_downsamples", downsamples},
        {"level", read.level},
        {"read_size", read.read_size},
        {"image_size", image_size},
        {"resized", read.read_size != image_size},
        {"workers", workers},
        {"batch", batch_size},
        {"tiles_read", source->size()},
        {"warmup_tiles", source->size() - timed_tiles},
        {"tiles", timed_tiles},
        {"seconds", seconds},
        {"tiles_per_second", static_cast<double>(timed_tiles) / seconds},
        {"cpu_seconds", cpu_seconds},
        {"tiles_per_cpu_second", static_cast<double>(timed_tiles) / cpu_seconds},
        {"read_seconds", read_seconds},
        {"resize_seconds", resize_seconds},
        {"normalise_seconds", normalise_seconds},
        {"setup_seconds", setup_seconds},
        {"checksum", checksum},
    };
    std::printf("%s\n", result.dump().c_str());
  } catch (const Error& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return static_cast<int>(error.code());
  }
  return 0;
}
