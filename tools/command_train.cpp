// tessera train: a CNN on patches (PCam-layout HDF5 or an LMDB tile store), or a slide-level
// head on spilled features (--features).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "common/files.h"
#include "common/output.h"
#include "common/progress.h"
#include "common/run_summary.h"
#include "common/units.h"
#include "compute/checkpoint.h"
#include "compute/data_parallel.h"
#include "compute/ops/clam_instance_loss.h"
#include "jobs/mil.h"
#include "jobs/mil_cross_validation.h"
#include "jobs/train.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/parse_errors.h"

namespace tessera::cli {

namespace {

struct TrainFlags {
  TrainOptions options;
  MilOptions mil;
  CrossValidationOptions cv;  // --folds K: cross-validation of a slide-level head
  int device = -1;
  std::vector<int> devices;  // --devices: one replica per device
  std::string memory_limit;
  int report_fd = -1;
  std::string class_weights;
  std::string precision = "fp32";
  // --resume of a checkpoint that already holds --epochs epochs: its last epoch's record.
  nlohmann::json finished;
  bool overwrite = false;
  std::optional<OutputLock> checkpoint_lock;  // held for the run by the process that writes it
  std::optional<OutputLock> predictions_lock;  // --fold-predictions, likewise
};

void add_train_flags(CLI::App& command, TrainFlags& f) {
  auto& o = f.options;
  // Exactly one source: patches for a CNN, or spilled features for a slide-level head.
  auto* source = command.add_option_group("source", "What to train on (one of)");
  source->add_option("--data", o.data,
                     "Patches: a PCam-layout HDF5 file, or LMDB tile stores (several, or a directory of them: "
                     "the shards of tile --shard), read as one");
  auto* features = source->add_option(
      "--features", f.mil.features, "Directory of per-slide feature files (tessera extract): train a slide-level head");
  source->require_option(1);
  command.add_option("--labels", f.mil.labels, "With --features: CSV of slide,label rows (slide = feature file stem), or CLAM's case_id,slide_id,label")
      ->needs(features);
  command.add_option("--head", f.mil.head,
                     "With --features: attention (gated, Ilse et al. 2018), mean or max (pooling over instances), "
                     "dsmil (Li et al. 2021: instance and bag classifiers, half the loss each), or clam-sb and "
                     "clam-mb (Lu et al. 2021: gated attention, one branch or one a class, and an instance "
                     "clustering loss on the top and bottom --k-sample patches), or transmil (Shao et al. 2021: "
                     "two Nystrom-attention layers with a convolutional position encoding between them)")
      ->capture_default_str()->check(CLI::IsMember(mil_heads()))->needs(features);
  command.add_option("--attention-hidden", f.mil.attention_hidden,
                     "With --features: width of the attention branches (dsmil: of its queries; transmil: of "
                     "its tokens, a multiple of 8); default 128, clam-sb and clam-mb 256, transmil 512")
      ->check(cli::at_least(1))->needs(features);
  // CLAM's main.py flags --B, --bag_weight and --subtyping; refused with another head (check_mil_flags).
  command.add_option("--k-sample", f.mil.clam.k_sample,
                     "clam-sb, clam-mb: patches of highest and of lowest attention the instance loss takes "
                     "(default 8, at most 64; a bag of fewer patches takes them all)")
      ->check(CLI::Range(1, static_cast<int>(kMaxKSample)))->needs(features);
  command.add_option("--bag-weight", f.mil.clam.bag_weight,
                     "clam-sb, clam-mb: the bag loss's weight; the instance loss takes the rest (default 0.7)")
      ->check(finite_in(0, 1))->needs(features);
  command.add_option("--subtyping", f.mil.clam.subtyping,
                     "clam-sb, clam-mb: true or false: the other classes' instance classifiers take the top "
                     "patches as negatives (default: true with more than two classes, as CLAM's subtyping task)")
      ->needs(features);
  // Flags of patch training that a head on features has no use for: an error with --features.
  command.add_option("--model", o.model, "Preset (small-cnn, resnet18, resnet50), model JSON, or checkpoint .h5 to start from")
      ->capture_default_str()->excludes(features);
  command.add_option("--width", o.width, "Channel width of small-cnn (conv1; conv2 and fc1 scale with it)")
      ->capture_default_str()->check(cli::at_least(1))->excludes(features);
  command.add_option("--epochs", o.epochs, "Passes over the training patches")->capture_default_str();
  command.add_option("--batch", o.batch,
                     "Micro-batch: patches on the device at once (default: the largest that fits the device's memory "
                     "with a margin, up to 64 on a GPU, and on a CPU device such as lavapipe up to four 224-pixel "
                     "patches' worth; printed as the run starts)")
      ->excludes(features);
  command.add_option("--accumulate", o.accumulate, "Micro-batches per optimizer step (effective batch = batch x K)")
      ->capture_default_str()->excludes(features);
  command.add_option("--optimizer", o.optimizer.kind, "sgd, adam, adamw or adagrad")
      ->capture_default_str()->check(CLI::IsMember({"sgd", "adam", "adamw", "adagrad"}));
  command.add_option("--lr", o.optimizer.lr, "Learning rate")->capture_default_str()->check(finite_positive());
  command.add_option("--momentum", o.optimizer.momentum, "SGD momentum")->capture_default_str()
      ->check(finite_non_negative());
  command.add_option("--weight-decay", o.optimizer.weight_decay, "Weight decay (decoupled for adamw)")
      ->capture_default_str()->check(finite_non_negative());
  command.add_option("--seed", o.seed, "Seed of initialisation, shuffling, augmentation and dropout")
      ->capture_default_str();
  command.add_option("--val-fraction", o.val_fraction, "Share of patches (whole slides) held out for validation")
      ->capture_default_str()->check(finite_in(0, 1));
  command.add_option("--class-weights", f.class_weights, "Cross-entropy weight per class, e.g. 1,3");
  command.add_flag("--augment", o.augment, "Flips, 90-degree rotations and colour jitter")->excludes(features);
  command.add_option("--workers", o.workers, "Loader threads")->capture_default_str()->check(cli::at_least(1))
      ->excludes(features);
  command.add_option("--checkpoint", o.checkpoint, "HDF5 checkpoint written after every epoch");
  auto* resume = command.add_flag("--resume", o.resume, "Continue from --checkpoint if it exists");
  command.add_flag("--overwrite", f.overwrite, "Train a new run over an existing --checkpoint, or replace --fold-predictions (without it, refused)")
      ->excludes(resume);
  command.add_flag("--dry-run", o.dry_run, "Print the device memory plan and exit");
  command.add_option("--precision", f.precision,
                     "fp32, or fp16: activations and their gradients in fp16 with dynamic loss scaling "
                     "(weights, gradients and optimizer state stay fp32)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "fp16"}));
  auto* device = command.add_option(
      "--device", f.device,
      "Vulkan device index (see tessera info); default: first discrete GPU, or under mpirun/srun the "
      "process's rank on its machine");
  command.add_option("--devices", f.devices,
                     "Data-parallel over these devices, e.g. 0,1 (one replica each; a CPU device may repeat): each "
                     "micro-batch is split over them and their gradients summed, so a step equals one device's "
                     "step on the whole batch (batch norm uses each device's own samples, or with --sync-bn "
                     "all of them). Under mpirun/srun every process takes these devices")
      ->delimiter(',')->excludes(device)->excludes(features);
  command.add_flag("--sync-bn", o.sync_batch_norm,
                   "Data-parallel: batch norm statistics over the samples of every device and process, as "
                   "PyTorch's SyncBatchNorm (each batch norm then waits for all of them, twice a step)")
      ->excludes(features);
  command.add_option("--device-memory-limit", f.memory_limit, "Device memory budget, e.g. 2GiB");
  command.add_option("--report-fd", f.report_fd, "Write trial protocol JSON lines to this file descriptor");
  // Cross-validation of a slide-level head: K heads, each scored on the fold it did not see.
  auto* folds = command.add_option(
      "--folds", f.cv.folds,
      "With --features: K-fold cross-validation, folds split by case (CLAM's case_id; else by slide) and "
      "stratified by label; reports each fold's AUC, balanced accuracy and macro F1 and their mean and std");
  folds->needs(features)->excludes(command.get_option("--checkpoint"))->excludes(resume)
      ->excludes(command.get_option("--val-fraction"));
  command.add_option("--seeds", f.cv.seeds, "With --folds: repeat the cross-validation N times, repeat r splitting "
                                            "and initialising from --seed + r")
      ->capture_default_str()->needs(folds);
  command.add_option("--fold-predictions", f.cv.predictions,
                     "With --folds: CSV of every held-out slide's class probabilities (seed, fold, case, slide, "
                     "label, prediction); --overwrite replaces it")
      ->needs(folds);
}

std::vector<float> parse_weights(const std::string& text) {
  std::vector<float> weights;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    float weight = 0;
    try {
      size_t used = 0;
      weight = std::stof(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw UsageError("--class-weights: '" + item + "' is not a number");
    }
    if (!std::isfinite(weight) || weight < 0)
      throw UsageError("--class-weights: '" + item + "' is not a finite number of at least 0");
    weights.push_back(weight);
  }
  if (std::none_of(weights.begin(), weights.end(), [](float w) { return w > 0; }))
    throw UsageError("--class-weights: at least one weight must be above 0");
  return weights;
}

// A saved setting as its flag would be written: "--data a.lmdb b.lmdb", not a JSON list; a float
// setting (saved as a double) as its shortest text, "0.01" rather than 0.009999999776482582.
std::string shown(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) {
    double number = value.get<double>();
    auto single = static_cast<float>(number);
    std::array<char, 64> text{};
    auto end = static_cast<double>(single) == number ? std::to_chars(text.begin(), text.end(), single).ptr
                                                     : std::to_chars(text.begin(), text.end(), number).ptr;
    return std::string(text.data(), end);
  }
  if (!value.is_array()) return value.dump();
  if (value.empty()) return "none";
  std::string text;
  const char* separator = value[0].is_string() ? " " : ",";  // --data a b, --class-weights 1,3
  for (auto& item : value) text += (text.empty() ? "" : separator) + shown(item);
  return text;
}

// A flag as the user typed it on this command line: "--lr 1e-2", "--augment".
std::string as_typed(const CLI::App& command, const char* flag) {
  const CLI::Option* option = command.get_option(flag);
  if (option->get_type_size() == 0) return flag;
  std::string text = flag;
  for (const std::string& value : option->results()) text += " " + value;
  return text;
}

// A resumed run continues the run that wrote the checkpoint: flags left out take the
// checkpoint's values, and a flag given with another value is an error that names it (exit 2),
// so that a resumed run never silently differs from the one it continues.
void settle_resume(const CLI::App& command, TrainFlags& f) {
  TrainOptions& o = f.options;
  if (!o.resume || o.checkpoint.empty() || !std::filesystem::exists(o.checkpoint)) return;
  nlohmann::json saved = read_checkpoint_progress(o.checkpoint);
  if (!saved.is_object()) return;
  // A slide-level head's run saves no --data (and, since its settings are saved, its --features).
  bool features = !f.mil.features.empty();
  bool saved_features = saved.contains("features") || saved.value("data", nlohmann::json::array()).empty();
  if (features != saved_features)
    throw UsageError(o.checkpoint + ": --resume continues the run that wrote it, which trained " +
                     (saved_features ? "a slide-level head on --features" : "a CNN on --data") +
                     "; start a new run with another --checkpoint");
  nlohmann::json settings = run_settings(o);
  if (features) settings.update(mil_settings(f.mil));
  static const std::pair<const char*, const char*> flags[] = {
      {"data", "--data"},         {"model", "--model"},       {"width", "--width"},
      {"batch", "--batch"},       {"accumulate", "--accumulate"}, {"optimizer", "--optimizer"},
      {"lr", "--lr"},             {"momentum", "--momentum"}, {"weight_decay", "--weight-decay"},
      {"seed", "--seed"},         {"val_fraction", "--val-fraction"}, {"class_weights", "--class-weights"},
      {"augment", "--augment"},   {"features", "--features"}, {"labels", "--labels"},
      {"head", "--head"},         {"attention_hidden", "--attention-hidden"}, {"precision", "--precision"},
      {"k_sample", "--k-sample"}, {"bag_weight", "--bag-weight"}, {"subtyping", "--subtyping"}};
  std::string differences;
  for (auto& [key, flag] : flags) {
    if (!saved.contains(key) || !settings.contains(key)) continue;
    if (command.count(flag) == 0) {
      settings[key] = saved[key];
    } else if (settings[key] != saved[key]) {
      std::string before = saved[key].is_boolean() ? (saved[key].get<bool>() ? flag : "without it") : shown(saved[key]);
      differences += std::string(differences.empty() ? "" : "; ") + as_typed(command, flag) +
                     " (the checkpoint's run: " + before + ")";
    }
  }
  if (!differences.empty())
    throw UsageError(o.checkpoint + ": --resume continues the run that wrote it, but " + differences +
                     ". Leave these flags out (or give the checkpoint's values), or start a new run with another "
                     "--checkpoint");
  settings.at("model").get_to(o.model);
  settings.at("width").get_to(o.width);
  settings.at("batch").get_to(o.batch);
  settings.at("accumulate").get_to(o.accumulate);
  settings.at("optimizer").get_to(o.optimizer.kind);
  settings.at("lr").get_to(o.optimizer.lr);
  settings.at("momentum").get_to(o.optimizer.momentum);
  settings.at("weight_decay").get_to(o.optimizer.weight_decay);
  settings.at("seed").get_to(o.seed);
  settings.at("val_fraction").get_to(o.val_fraction);
  settings.at("class_weights").get_to(o.class_weights);
  settings.at("augment").get_to(o.augment);
  if (features) {
    settings.at("head").get_to(f.mil.head);
    settings.at("attention_hidden").get_to(f.mil.attention_hidden);
    if (settings.contains("k_sample")) {  // a clam head's; null where the first run took the default
      ClamOptions& clam = f.mil.clam;
      if (!settings["k_sample"].is_null()) clam.k_sample = settings["k_sample"].get<int>();
      if (!settings["bag_weight"].is_null()) clam.bag_weight = settings["bag_weight"].get<double>();
      if (!settings["subtyping"].is_null()) clam.subtyping = settings["subtyping"].get<bool>();
    }
  }
  o.fp16 = settings.at("precision") == "fp16";
  int done = saved.value("epoch", 0);
  if (done < o.epochs) return;
  if (!saved.contains("metrics") || !saved["metrics"].is_object())
    throw UsageError(o.checkpoint + ": already holds " + std::to_string(done) + " epochs, and --epochs is " +
                     std::to_string(o.epochs) + ": raise --epochs to train on");
  f.finished = saved["metrics"];
}

// --device-memory-limit in bytes (0: not given).
uint64_t memory_limit(const TrainFlags& f) {
  if (f.memory_limit.empty()) return 0;
  uint64_t bytes = parse_bytes(f.memory_limit, "--device-memory-limit");
  if (bytes == 0)
    throw UsageError("--device-memory-limit: must be above 0 (leave it out to use the whole device)");
  return bytes;
}

// A checkpoint is HDF5 whatever its name; a name that says PyTorch's or safetensors' format would
// send a reader of that format to a file it cannot read.
void refuse_foreign_checkpoint_name(const std::string& checkpoint) {
  const std::string extension = lowercase_extension(checkpoint);
  for (const char* foreign : {".safetensors", ".pt", ".pth"})
    if (extension == foreign)
      throw UsageError("--checkpoint " + checkpoint + ": tessera writes checkpoints as HDF5, not the " + foreign +
                       " format its name says; give a name ending .h5");
}

// Flags that cannot work together or with the checkpoint to resume; before any device work.
void check_flags(const CLI::App& command, TrainFlags& f) {
  if (command.count("--folds") && f.cv.folds < 2)
    throw UsageError("--folds must be at least 2 (got " + std::to_string(f.cv.folds) + "): each fold is scored by a "
                     "head trained on the others");
  if (f.cv.seeds < 1) throw UsageError("--seeds must be at least 1 (got " + std::to_string(f.cv.seeds) + ")");
  if (!f.class_weights.empty()) f.options.class_weights = parse_weights(f.class_weights);
  memory_limit(f);
  if (command.count("--batch") && f.options.batch < 1) throw UsageError("--batch must be at least 1");
  f.options.val_fraction_default = command.count("--val-fraction") == 0;
  f.options.fp16 = f.precision == "fp16";
  std::vector<InputPath> inputs{{"--features", f.mil.features},
                                 {"--labels", f.mil.labels},
                                 {"--model", std::filesystem::exists(f.options.model) ? f.options.model : ""}};
  for (auto& path : f.options.data) inputs.push_back({"--data", path});
  refuse_foreign_checkpoint_name(f.options.checkpoint);
  refuse_output_over_inputs("--checkpoint", f.options.checkpoint, inputs);
  refuse_output_over_inputs("--fold-predictions", f.cv.predictions, inputs);
  settle_resume(command, f);
}

// Locks the checkpoint (and --fold-predictions) for the run, before any work: a second run on it
// is refused naming this one, a directory that cannot be written is named with the reason, and an
// existing checkpoint is replaced only by --overwrite (or continued by --resume).
void lock_outputs(TrainFlags& f) {
  const TrainOptions& o = f.options;
  if (!f.cv.predictions.empty() && !o.dry_run) {
    f.predictions_lock.emplace(f.cv.predictions);
    check_replaceable(f.cv.predictions, "--fold-predictions", f.overwrite ? Existing::overwrite : Existing::refuse);
  }
  if (o.checkpoint.empty() || o.dry_run) return;
  f.checkpoint_lock.emplace(o.checkpoint);
  check_replaceable(o.checkpoint, "--checkpoint",
                    o.resume ? Existing::resume : f.overwrite ? Existing::overwrite : Existing::refuse,
                    "give --resume to continue the run that wrote it, or --overwrite to train a new one in its place");
}

// The final report of a run that had nothing left to do: the checkpoint's last epoch.
void report_finished(vk::Context& context, const TrainFlags& f,
                     const std::function<void(const nlohmann::json&)>& protocol) {
  const nlohmann::json& last = f.finished;
  std::string record = Progress::human() ? render_record("train", last) : last.dump();
  std::fprintf(stderr, "%s: already trained %d epochs (--epochs %d); nothing to do. Its last epoch: %s\n",
               f.options.checkpoint.c_str(), last.value("epoch", 0), f.options.epochs, record.c_str());
  protocol({{"type", "final"},
            {"value", last["val_loss"].is_number() ? last["val_loss"] : last["train_loss"]},
            {"metrics", last},
            {"peak_device_bytes", last.value("peak_device_bytes", 0)},
            {"device", context.info().name}});
}

// A limit above what the device has cannot be met: the device bounds the run, and it says so.
void cap_to_device(vk::Context& context, uint64_t limit) {
  uint64_t device_bytes = 0;
  for (auto& heap : context.info().heaps)
    if (heap.device_local) device_bytes = std::max(device_bytes, heap.size);
  if (limit == 0 || limit <= device_bytes) {
    if (limit) context.allocator().set_budget(limit);
    return;
  }
  context.allocator().set_budget(device_bytes);
  std::string warning = "--device-memory-limit " + format_bytes(limit) + " is more than " + context.info().name +
                        " has (" + format_bytes(device_bytes) + "): the run is bounded by the device";
  if (isatty(STDERR_FILENO))
    std::fprintf(stderr, "tessera train: warning: %s\n", warning.c_str());
  else
    std::fprintf(stderr, "%s\n", nlohmann::json{{"task", "train"}, {"warning", warning}}.dump().c_str());
}

vk::ContextOptions context_options(int device_index) {
  vk::ContextOptions options = vk::options_from_environment();
  options.device_index = device_index;
  return options;
}

// The devices this process trains on: --devices, else --device, else under an MPI launcher the
// device of the process's rank on its machine, else the default choice.
std::vector<std::unique_ptr<vk::Context>> open_devices(const TrainFlags& f, const Processes& processes) {
  std::vector<int> indices = f.devices;
  if (!indices.empty()) {
    vk::named_devices(indices, "--devices");
  } else if (f.device < 0 && processes.launched()) {
    indices.push_back(processes.local_rank());
    if (static_cast<size_t>(processes.local_rank()) >= vk::list_devices().size())
      throw UsageError("the process's local rank: device " + std::to_string(processes.local_rank()) +
                       " does not exist (see tessera info); give --device N to choose one, which processes may share");
  } else {
    if (f.device >= 0) vk::named_devices({f.device}, "--device");
    indices.push_back(f.device);
  }
  std::vector<std::unique_ptr<vk::Context>> contexts;
  for (int index : indices) {
    contexts.push_back(std::make_unique<vk::Context>(context_options(index)));
    cap_to_device(*contexts.back(), memory_limit(f));
  }
  return contexts;
}

// --dry-run: the plan as a table on a terminal, else as one JSON line.
void print_plan(vk::Context& context, const MemoryPlan& plan) {
  uint64_t device_bytes = plan.device_bytes(context.allocator()), budget = context.allocator().stats().budget_bytes;
  nlohmann::json out = {{"device", context.info().name},
                        {"budget_bytes", budget},
                        {"total_bytes", plan.total()},
                        {"device_bytes", device_bytes},
                        {"fits", plan.fits(context)},
                        {"bytes", plan.bytes},
                        {"staging_slots", plan.staging_slots}};
  // The largest buffers, which are what a change of flags or bag size would move.
  std::vector<vk::PlannedBuffer> largest = plan.buffers;
  std::stable_sort(largest.begin(), largest.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  largest.resize(std::min<size_t>(largest.size(), 12));
  for (const vk::PlannedBuffer& buffer : largest)
    out["largest_buffers"].push_back({{"name", buffer.name}, {"bytes", buffer.bytes}});
  const vk::PlannedBuffer* oversized = plan.oversized(context.info());
  if (oversized)
    out["oversized_buffer"] = {{"name", oversized->name}, {"bytes", oversized->bytes},
                               {"largest_bytes", context.info().largest_buffer}};
  if (!Progress::human(STDOUT_FILENO)) {
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("Device memory plan on %s\n", context.info().name.c_str());
  for (auto& [category, bytes] : plan.bytes) std::printf("  %-24s %12s\n", category.c_str(), format_bytes(bytes).c_str());
  std::printf("  %-24s %12s\n", "total", format_bytes(plan.total()).c_str());
  std::printf("  largest buffers:\n");
  for (const vk::PlannedBuffer& buffer : largest)
    std::printf("    %-48s %12s\n", buffer.name.c_str(), format_bytes(buffer.bytes).c_str());
  if (plan.staging_slots == 1) std::printf("  one staged copy of each batch: two do not fit, so none loads while a step runs\n");
  std::printf("  %-24s %12s of the budget's %s: %s\n", "in the allocator's blocks", format_bytes(device_bytes).c_str(),
              format_bytes(budget).c_str(), plan.fits(context) ? "fits" : "does NOT fit");
  if (oversized)
    std::printf("  %s: a buffer of %s, over the largest the device binds (%s)\n", oversized->name.c_str(),
                format_bytes(oversized->bytes).c_str(), format_bytes(context.info().largest_buffer).c_str());
}

void run(const std::vector<vk::Context*>& devices, TrainFlags& f,
         const std::function<void(const nlohmann::json&)>& protocol) {
  vk::Context& context = *devices.front();
  if (f.finished.is_object()) {
    if (Processes::world().rank() == 0) report_finished(context, f, protocol);
    return;
  }
  TrainReporting reporting;
  reporting.protocol = protocol;
  bool features = !f.mil.features.empty();
  if (features && f.mil.labels.empty()) throw UsageError("--features needs --labels slides.csv");
  if (f.options.dry_run) {
    auto plans = features ? std::vector<MemoryPlan>{plan_mil(context, f.options, f.mil)} : plan_training(devices, f.options);
    // A plan per device, each checked against its own budget once all are printed.
    for (size_t d = 0; d < plans.size(); ++d) print_plan(*devices[d], plans[d]);
    for (size_t d = 0; d < plans.size(); ++d)
      check_plan_fits(*devices[d], plans[d],
                      "the plan above lists what it holds" +
                          (plans.size() > 1 ? " (--devices entry " + std::to_string(d) + ")" : std::string()));
    return;
  }
  if (features && f.cv.folds) {
    nlohmann::json result = cross_validate_mil(context, f.options, f.mil, f.cv, reporting);
    print_result(result, cross_validation_table(result));
  } else if (features) {
    train_mil(context, f.options, f.mil, reporting);
  } else {
    train(devices, f.options, reporting);
  }
  if (!f.options.checkpoint.empty() && Processes::world().rank() == 0)
    report("train", {{"event", "checkpoint"}, {"path", f.options.checkpoint}, {"epoch", f.options.epochs}});
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* command = app.add_subcommand("train", "Train a CNN on patches (PCam-layout HDF5 or LMDB tile store)");
  auto flags = std::make_shared<TrainFlags>();
  add_train_flags(*command, *flags);
  command->callback([command, flags] {
    std::FILE* report = nullptr;
    if (flags->report_fd >= 0) {
      report = fdopen(flags->report_fd, "w");
      if (!report) throw UsageError("--report-fd " + std::to_string(flags->report_fd) + ": not an open file descriptor");
    }
    check_flags(*command, *flags);
    // Under mpirun or srun, MPI starts here: the rank on this machine picks the default device.
    Processes& processes = Processes::world();
    if (processes.rank() == 0) lock_outputs(*flags);
    {
      auto contexts = open_devices(*flags, processes);
      std::vector<vk::Context*> devices;
      for (auto& context : contexts) {
        if (flags->options.fp16) require_fp16_storage(context->info(), "train");
        devices.push_back(context.get());
      }
      run(devices, *flags, [report](const nlohmann::json& line) {
        if (!report) return;
        std::fprintf(report, "%s\n", line.dump().c_str());
        std::fflush(report);
      });
    }
    processes.finish();
    flags->checkpoint_lock.reset();
    flags->predictions_lock.reset();
  });
}

int run_train_in_process(const std::vector<std::string>& args,
                         const std::function<void(const std::string& json_line)>& report) {
  // One device for every trial of the process, as an in-process search would have it.
  static std::unique_ptr<vk::Context> shared;
  CLI::App app{"tessera train (in process)", "train"};
  TrainFlags flags;
  add_train_flags(app, flags);
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
    check_flags(app, flags);
    lock_outputs(flags);
    if (!flags.devices.empty())
      throw UsageError("--devices: an in-process trial (--isolation none) shares one device; leave --isolation at its default");
    if (!shared) shared = std::make_unique<vk::Context>(context_options(flags.device));
    if (flags.options.fp16) require_fp16_storage(shared->info(), "train");
    cap_to_device(*shared, memory_limit(flags));
    run({shared.get()}, flags, [&](const nlohmann::json& line) { report(line.dump()); });
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s\n", explain_parse_error(app, e).c_str());
    return static_cast<int>(ExitCode::bad_usage);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera train: %s\n", e.what());
    return exit_code_of(e);
  }
}

}  // namespace tessera::cli
