#include "jobs/extract.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "common/error.h"
#include "common/run_summary.h"
#include "compute/feature_file.h"
#include "compute/vk/context.h"
#include "jobs/extract_inputs.h"
#include "jobs/extract_pipeline.h"
#include "jobs/extract_plan.h"
#include "jobs/extractor.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void create_directory(const std::string &directory) {
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) throw Error(ExitCode::runtime_error, directory + ": cannot create the directory: " + error.message());
}

// The run's totals: tiles/s, where the time went and how busy the devices were.
nlohmann::json run_totals(const std::vector<nlohmann::json> &devices, const SlideTimes &times, double seconds,
                          uint64_t tiles) {
  double device_seconds = 0, wait_seconds = 0, write_seconds = 0;
  uint64_t planned = 0, peak = 0;
  for (const nlohmann::json &device : devices) {
    device_seconds += device["device_seconds"].get<double>();
    wait_seconds += device["data_wait_seconds"].get<double>();
    write_seconds += device["hdf5_write_seconds"].get<double>();
    planned = std::max(planned, device["planned_device_bytes"].get<uint64_t>());
    peak = std::max(peak, device["peak_device_bytes"].get<uint64_t>());
  }
  // Fractions of the devices' wall time: busy running models, or idle waiting for tiles.
  const double device_wall = seconds * static_cast<double>(devices.size());
  const double tiles_per_second = seconds > 0 ? static_cast<double>(tiles) / seconds : 0.0;
  return {{"tiles", tiles},
          {"seconds", seconds},
          {"tiles_per_second", tiles_per_second},
          {"features_per_second", tiles_per_second},
          {"device_seconds", device_seconds},
          {"device_busy_fraction", device_wall > 0 ? device_seconds / device_wall : 0.0},
          {"data_wait_fraction", device_wall > 0 ? wait_seconds / device_wall : 0.0},
          {"times", times.to_json()},
          {"decoded_tiles", times.decoded},
          {"planned_device_bytes", planned},
          {"peak_device_bytes", peak},
          {"hdf5_write_seconds", write_seconds},
          {"hdf5_write_share", seconds > 0 ? write_seconds / seconds : 0.0}};
}

}  // namespace

int default_extract_workers() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1); }

void extract_features(const ExtractOptions &options, nlohmann::json *summary_so_far, SlideObserver *observer) {
  if (options.slides.empty() == options.tiles.empty() && !options.dry_run)
    throw UsageError("give either --slides or --tiles");
  if (!options.coords.empty() && options.slides.empty()) throw UsageError("--coords reads --slides at its coordinates");
  if (options.batch < 0) throw UsageError("--batch must be at least 1");
  if (options.workers < 1) throw UsageError("--workers must be at least 1");
  std::vector<int> devices = options.devices.empty() ? std::vector<int>{options.device} : options.devices;
  if (!options.devices.empty()) vk::named_devices(options.devices, "--devices");
  std::vector<ExtractModel> models = resolve_extract_models(options);
  if (options.dry_run) {
    read_extract_weights(models);
    for (ExtractModel &model : models)
      if (!model.encoder) model.input_size = options.tiler.size;
    return print_extraction_plans(options, models, devices);
  }
  // Every slide opened and checked (its pixel size, its coordinates) before any weights are read,
  // a model is built or anything written.
  ExtractInputs inputs = gather_extract_inputs(options, std::move(models));
  read_extract_weights(inputs.models);
  nlohmann::json summary = {{"shard",
                             {{"index", options.shard.index},
                              {"count", options.shard.count},
                              {"slides", inputs.slides.size()},
                              {"of", inputs.shard_of}}}};
  if (inputs.slides.empty()) {  // more tasks than slides: this one has nothing to do
    summary.update({{"slides", nlohmann::json::array()}, {"tiles", 0}});
    if (summary_so_far) *summary_so_far = summary;
    print_result(summary, "no slide for shard " + std::to_string(options.shard.index) + "/" +
                              std::to_string(options.shard.count) + " of " + std::to_string(inputs.shard_of) + "\n");
    return;
  }
  nlohmann::json listed = nlohmann::json::array();
  for (const SlideInput &slide : inputs.slides)
    listed.push_back({{"slide", slide.name}, {"path", slide.path}, {"status", "not started"}});
  if (summary_so_far) {  // what the run report holds of a run that fails before its first slide
    *summary_so_far = summary;
    (*summary_so_far)["slides"] = listed;
  }
  // The models on each device, planned together and checked against its budget before any work.
  std::vector<std::unique_ptr<DeviceModels>> device_models;
  for (int device : devices)
    device_models.push_back(std::make_unique<DeviceModels>(options, inputs.models, device));
  for (const ExtractModel &model : inputs.models) create_directory(model.folder);
  // Before any work: a file another slide or other settings made is not replaced unasked.
  const Existing existing = options.overwrite ? Existing::overwrite : Existing::refuse;
  for (const SlideInput &slide : inputs.slides)
    for (const SlideRead &read : slide.reads)
      for (size_t m : read.models)
        check_feature_file_replaceable(feature_path(inputs.models[m], slide),
                                       feature_layout(slide, read, inputs.models[m],
                                                      device_models.front()->at(m).extraction(), options),
                                       existing);
  // The run's work begins: its report lists the slides from here.
  if (observer) {
    nlohmann::json chosen = nlohmann::json::array();
    for (auto &on_device : device_models) chosen.push_back(on_device->report());
    observer->devices_chosen(chosen);
    observer->slides_listed(listed);
  }
  // Throughput counts from here: building the models and their pipelines is a fixed cost.
  auto start = Clock::now();
  SharedRun run(inputs, options, device_models.size(), observer);
  for (auto &on_device : device_models) {
    if (!on_device->one_at_a_time().is_null()) run.event(on_device->one_at_a_time());
    for (size_t m = 0; m < on_device->size(); ++m)
      if (!on_device->at(m).capped().is_null()) run.event(on_device->at(m).capped());
  }
  // The reading threads are shared out among the devices; each device also has its own three.
  const int workers = std::max(1, options.workers / static_cast<int>(device_models.size()));
  std::vector<std::unique_ptr<DevicePipeline>> pipelines;
  for (size_t k = 0; k < device_models.size(); ++k)
    pipelines.push_back(std::make_unique<DevicePipeline>(k, *device_models[k], run, workers));
  for (auto &pipeline : pipelines) pipeline->start();
  for (auto &pipeline : pipelines) pipeline->join();
  SlideTimes times;
  std::exception_ptr error;
  const std::vector<nlohmann::json> &per_slide = run.finish(times, error);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  nlohmann::json per_device = nlohmann::json::array();
  uint64_t tiles = 0;
  for (auto &pipeline : pipelines) {
    per_device.push_back(pipeline->report());
    tiles += per_device.back()["tiles"].get<uint64_t>();
  }
  std::vector<std::string> failures, in_use;
  for (const nlohmann::json &slide : per_slide) {
    if (slide["status"] == "failed") failures.push_back(slide["error"]);
    if (slide["status"] == "in use") in_use.push_back(slide["error"]);
  }
  nlohmann::json extractions = nlohmann::json::array();
  for (size_t m = 0; m < inputs.models.size(); ++m) extractions.push_back(device_models.front()->at(m).extraction());
  summary.update({{"extraction", extractions.front()},
                  {"device", per_device.front()["name"]},
                  {"devices", per_device},
                  {"workers", workers * static_cast<int>(device_models.size())},
                  {"slides", per_slide}});
  if (inputs.models.size() > 1) summary["extractions"] = extractions;
  if (options.skip_errors) summary["skipped"] = failures;
  summary.update(run_totals(per_device, times, seconds, tiles));
  if (summary_so_far) *summary_so_far = summary;
  if (error) std::rethrow_exception(error);
  print_result(summary, slides_table(per_slide, tiles, seconds) + "features: " + options.out + "  (" +
                            per_device.front()["name"].get<std::string>() + ", busy " +
                            std::to_string(std::lround(100 * summary["device_busy_fraction"].get<double>())) + "%)\n");
  if (!failures.empty() && !options.skip_errors) {
    std::string message = std::to_string(failures.size()) + " slide(s) failed (the ones before are complete):";
    for (auto &failure : failures) message += "\n  " + failure;
    throw BadInput(message + "\n(--skip-errors goes on past such a slide)");
  }
  if (!in_use.empty()) {
    std::string message = std::to_string(in_use.size()) +
                          " slide(s) were being written by another run, and were left to it (the others are "
                          "complete; run again once it ends):";
    for (auto &slide : in_use) message += "\n  " + slide;
    throw Error(ExitCode::runtime_error, message);
  }
}

}  // namespace tessera
