#include "jobs/train.h"

#include <cstring>
#include <filesystem>
#include <optional>

#include "common/error.h"
#include "common/progress.h"
#include "common/units.h"
#include "compute/data_parallel.h"
#include "compute/ops/registry.h"
#include "compute/run_checks.h"
#include "data/loader.h"
#include "data/split.h"
#include "jobs/batch_choice.h"

namespace tessera {

namespace {

// Throws BadInput (exit 5) naming the data when its labels do not fit a model of `classes`
// outputs (labels are class indices in [0, classes)).
void check_labels_fit(const data::PatchSource& source, int64_t classes) {
  if (source.class_count() > static_cast<uint64_t>(classes))
    throw BadInput(source.description() + ": holds label " + std::to_string(source.class_count() - 1) + ", but the model has " +
                   std::to_string(classes) + " classes (labels must be in [0, " + std::to_string(classes) + "))");
}

// Throws UsageError when the training split is too small for one optimizer step, saying
// what to change.
void check_training_patches(const data::PatchSource& source, const TrainOptions& options, size_t train_patches,
                            size_t val_patches) {
  size_t per_step = static_cast<size_t>(options.batch) * static_cast<size_t>(options.accumulate);
  if (train_patches >= per_step) return;
  throw UsageError("--batch " + std::to_string(options.batch) + " x --accumulate " +
                   std::to_string(options.accumulate) + " needs " + std::to_string(per_step) +
                   " training patches; " + source.description() + " has " + std::to_string(train_patches) +
                   " for training (" + std::to_string(val_patches) + " held out for validation (--val-fraction " +
                   format_number(options.val_fraction) + ") of " + std::to_string(source.size()) +
                   "): lower --batch or --val-fraction");
}

// Throws BadInput naming the data when its patches are all of one class: nothing to classify.
void check_two_classes(const data::PatchSource& source, const std::vector<uint64_t>& per_class) {
  std::vector<size_t> present;
  for (size_t c = 0; c < per_class.size(); ++c)
    if (per_class[c]) present.push_back(c);
  if (present.size() < 2)
    throw BadInput(source.description() + ": every patch is of class " +
                   (present.empty() ? std::string("?") : std::to_string(present[0])) +
                   ": a classifier needs patches of at least two classes (were the slides tiled without --labels?)");
}

// Throws ModelError naming `model` when it has no parameters: nothing to train, and no gradient
// for the loss to send back.
void check_trainable(const TrainingJob& job, const std::string& model) {
  std::optional<Network> built;
  try {
    built.emplace(job.graph, job.staged, true, job.prologue);
  } catch (const ModelError& e) {
    throw model_error_of(model, e);
  }
  const Network& network = *built;
  for (auto& layer : network.layers())
    for (auto& spec : layer.specs)
      if (spec.role == TensorRole::parameter) return;
  throw ModelError(model + ": the model has no parameters to train");
}

// The data and the model as the run will use them.
struct Setup {
  std::unique_ptr<data::PatchSource> source;
  std::vector<size_t> train_indices, val_indices;
  std::vector<std::string> held_out;  // the validation slides
  TrainingJob job;
};

// The split before any work: what was held out, and each warning on a line of its own.
void report_split(const Setup& setup) {
  nlohmann::json record = {{"event", "split"}};
  record.update(setup.job.report.at("split"));
  if (!setup.held_out.empty()) record["held_out_slides"] = setup.held_out;
  report("train", record);
  for (auto& warning : record["warnings"]) report("train", {{"warning", warning}});
}

// The staged inputs of the job at micro-batch `n`.
void stage_batch(TrainingJob& job, const data::PatchSource& source, int64_t n) {
  job.staged = {{"images", {n, source.height(), source.width(), source.channels()}, DType::u8},
                {"labels", {n}, DType::u32},
                {"valid", {1}, DType::u32}};
}

Setup prepare(const TrainOptions& options) {
  if (options.batch < 1) throw UsageError("--batch must be at least 1");
  if (options.accumulate < 1) throw UsageError("--accumulate must be at least 1");
  if (options.epochs < 1) throw UsageError("--epochs must be at least 1");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) throw UsageError("--val-fraction must be in [0, 1)");
  if (options.resume && options.checkpoint.empty()) throw UsageError("--resume needs --checkpoint PATH");
  Setup setup;
  if (options.data.empty()) throw UsageError("--data: give a patch file or tile stores");
  setup.source = data::open_patches(options.data);
  if (setup.source->size() == 0) throw BadInput(setup.source->description() + ": holds no patches");
  data::GroupSplit split = data::split_by_group(*setup.source, options.val_fraction, options.val_fraction_default);
  check_two_classes(*setup.source, data::patches_per_class(split.report));
  setup.train_indices = std::move(split.train);
  setup.val_indices = std::move(split.validation);
  setup.held_out = std::move(split.held_out);
  check_training_patches(*setup.source, options, setup.train_indices.size(), setup.val_indices.size());
  // The loader drops the last incomplete batch, and the loop the micro-batches short of a step:
  // a different few each epoch, as the order is shuffled.
  size_t per_step = static_cast<size_t>(options.batch) * static_cast<size_t>(options.accumulate);
  size_t used = setup.train_indices.size() / per_step * per_step;
  split.report["train_patches_per_epoch"] = used;
  split.report["dropped_per_epoch"] = setup.train_indices.size() - used;
  int classes = static_cast<int>(std::max<uint32_t>(setup.source->class_count(), 2));
  TrainingJob& job = setup.job;
  if (options.resume && std::filesystem::exists(options.checkpoint)) {
    job.start = read_checkpoint(options.checkpoint);
    job.start_path = options.checkpoint;
    job.model = job.start->model;
  } else if (is_checkpoint_path(options.model)) {
    job.start = read_checkpoint(options.model);
    job.start_path = options.model;
    job.start->train.clear();  // weights only: a new run from pretrained parameters
    job.start->progress = nullptr;
    job.model = expand_presets(job.start->model);
  } else {
    job.model = load_model_description(options.model, classes, options.width);
  }
  job.graph = job.start_path.empty() ? expand_presets(job.model)
                                     : check_model_description(job.model, job.start_path + " (attribute 'model')");
  // uint8 pixels as loaded (RGB, or a multiplex slide's channels) become the layer the model reads as "input".
  job.prologue = nlohmann::json::array({{{"name", "input"}, {"type", "input_normalize"}, {"inputs", {"images"}}}});
  stage_batch(job, *setup.source, options.batch);
  job.settings = run_settings(options);
  job.advice = "lower --batch and raise --accumulate, or raise --device-memory-limit";
  job.report["split"] = split.report;
  check_trainable(job, job.start_path.empty() ? options.model : job.start_path);
  return setup;
}

// Batches of patches from the prefetching loader.
class PatchFeed : public Feed {
 public:
  PatchFeed(const data::PatchSource& source, std::vector<size_t> indices, data::LoaderOptions options)
      : loader_(source, std::move(indices), options) {}
  size_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }
  void start_epoch(uint32_t epoch) override { loader_.start_epoch(epoch); }
  void compute_only(int64_t first, int64_t count) override {
    loader_.decode_only({static_cast<size_t>(first), static_cast<size_t>(count)});
  }
  bool next(const std::map<std::string, const Tensor*>& staged) override {
    if (!loader_.next(batch_)) return false;
    std::memcpy(staged.at("images")->buffer().mapped(), batch_.images.data(), batch_.images.size());
    std::memcpy(staged.at("labels")->buffer().mapped(), batch_.labels.data(), batch_.labels.size() * 4);
    auto valid = static_cast<uint32_t>(batch_.count);
    std::memcpy(staged.at("valid")->buffer().mapped(), &valid, 4);
    return true;
  }

 private:
  data::Loader loader_;
  data::Batch batch_;
};

// The setup at --batch or, without it, at the batch chosen from the plan on these devices (the
// largest that fits each device's budget with a margin, up to what still makes them faster),
// which `options` then holds and a line reports.
Setup prepare_batch(const std::vector<vk::Context*>& devices, TrainOptions& options) {
  if (options.batch != 0) return prepare(options);
  options.batch = 1;
  const Setup once = prepare(options);  // the data and the model checked, at the smallest batch
  // A micro-batch is split over the replicas (every device of every process): chosen per replica.
  const int64_t replicas = static_cast<int64_t>(devices.size()) * Processes::world().size();
  const int64_t most = static_cast<int64_t>(once.train_indices.size()) / options.accumulate / replicas;
  // The budget's share on the device with the least.
  uint64_t budget = UINT64_MAX;
  for (vk::Context* device : devices) budget = std::min(budget, device->allocator().stats().budget_bytes);
  const auto share = static_cast<uint64_t>(static_cast<double>(budget) * chosen_batch_budget_share);
  const int64_t pixels = int64_t{once.source->height()} * once.source->width();
  BatchChoice choice = choose_batch(batch_speed_cap(devices.front()->info(), pixels), most, share, [&](int64_t per_replica) {
    const int64_t batch = per_replica * replicas;
    TrainOptions at = options;
    at.batch = static_cast<int>(batch);
    TrainingJob job = once.job;
    stage_batch(job, *once.source, batch);
    job.settings = run_settings(at);
    const TrainingLoop loop(devices, loop_settings(at), std::move(job));
    const std::vector<MemoryPlan> plans = loop.plans();
    uint64_t bytes = 0;
    for (size_t d = 0; d < plans.size(); ++d)
      bytes = std::max(bytes, plans[d].device_bytes(devices[d]->allocator()));
    return bytes;
  });
  choice.batch *= replicas;
  options.batch = static_cast<int>(choice.batch);
  nlohmann::json record = {{"event", "batch"}};
  record.update(choice.to_json());
  report("train", record);
  return prepare(options);
}

}  // namespace

std::vector<MemoryPlan> plan_training(const std::vector<vk::Context*>& devices, TrainOptions options) {
  Setup setup = prepare_batch(devices, options);
  TrainingLoop loop(devices, loop_settings(options), std::move(setup.job));
  check_labels_fit(*setup.source, loop.classes());
  return loop.plans();
}

void train(const std::vector<vk::Context*>& devices, TrainOptions options, const TrainReporting& reporting) {
  const bool chosen = options.batch == 0;
  Setup setup = prepare_batch(devices, options);
  // A sweep's --oom-retry halves the batch a trial ran at, which it learns here when train chose it.
  if (chosen && reporting.protocol)
    reporting.protocol({{"type", "batch"}, {"batch", options.batch}, {"accumulate", options.accumulate}});
  if (reporting.progress) report_split(setup);
  // Replicated, every process loads whole batches (in the same order) and each replica takes its part.
  TrainingLoop loop(devices, loop_settings(options), std::move(setup.job));
  check_labels_fit(*setup.source, loop.classes());
  data::LoaderOptions train_loading{static_cast<size_t>(options.batch), true, true, options.augment,
                                    options.seed, options.workers, 4};
  data::LoaderOptions val_loading{static_cast<size_t>(options.batch), false, false, false, options.seed,
                                  options.workers, 4};
  PatchFeed train_feed(*setup.source, setup.train_indices, train_loading);
  PatchFeed val_feed(*setup.source, setup.val_indices, val_loading);
  loop.run(train_feed, val_feed, reporting);
}

}  // namespace tessera
