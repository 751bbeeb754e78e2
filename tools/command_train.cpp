// tessera train: a CNN on patches (PCam-layout HDF5 or an LMDB tile store), or a slide-level
// head on spilled features (--features).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "common/units.h"
#include "jobs/mil.h"
#include "jobs/train.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace tessera::cli {

namespace {

struct TrainFlags {
  TrainOptions options;
  MilOptions mil;
  int device = -1;
  std::string memory_limit;
  int report_fd = -1;
  std::string class_weights;
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
  command.add_option("--labels", f.mil.labels, "With --features: CSV of slide,label rows (slide = feature file stem)")
      ->needs(features);
  command.add_option("--head", f.mil.head, "With --features: mean or attention (gated, Ilse et al. 2018)")
      ->capture_default_str()->check(CLI::IsMember({"mean", "attention"}))->needs(features);
  command.add_option("--attention-hidden", f.mil.attention_hidden, "With --features: width of the attention branches")
      ->capture_default_str()->check(CLI::PositiveNumber)->needs(features);
  command.add_option("--model", o.model, "Preset (small-cnn, resnet18), model JSON, or checkpoint .h5 to start from")
      ->capture_default_str();
  command.add_option("--width", o.width, "Channel width of small-cnn (conv1; conv2 and fc1 scale with it)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  command.add_option("--epochs", o.epochs, "Passes over the training patches")->capture_default_str();
  command.add_option("--batch", o.batch, "Micro-batch: patches on the device at once")->capture_default_str();
  command.add_option("--accumulate", o.accumulate, "Micro-batches per optimizer step (effective batch = batch x K)")
      ->capture_default_str();
  command.add_option("--optimizer", o.optimizer.kind, "sgd, adam, adamw or adagrad")
      ->capture_default_str()->check(CLI::IsMember({"sgd", "adam", "adamw", "adagrad"}));
  command.add_option("--lr", o.optimizer.lr, "Learning rate")->capture_default_str()->check(finite_positive());
  command.add_option("--momentum", o.optimizer.momentum, "SGD momentum")->capture_default_str();
  command.add_option("--weight-decay", o.optimizer.weight_decay, "Weight decay (decoupled for adamw)")
      ->capture_default_str();
  command.add_option("--seed", o.seed, "Seed of initialisation, shuffling, augmentation and dropout")
      ->capture_default_str();
  command.add_option("--val-fraction", o.val_fraction, "Share of patches (whole slides) held out for validation")
      ->capture_default_str();
  command.add_option("--class-weights", f.class_weights, "Cross-entropy weight per class, e.g. 1,3");
  command.add_flag("--augment", o.augment, "Flips, 90-degree rotations and colour jitter");
  command.add_option("--workers", o.workers, "Loader threads")->capture_default_str()->check(CLI::PositiveNumber);
  command.add_option("--checkpoint", o.checkpoint, "HDF5 checkpoint written after every epoch");
  command.add_flag("--resume", o.resume, "Continue from --checkpoint if it exists");
  command.add_flag("--dry-run", o.dry_run, "Print the device memory plan and exit");
  command.add_option("--device", f.device, "Vulkan device index (see tessera info); default: first discrete GPU");
  command.add_option("--device-memory-limit", f.memory_limit, "Device memory budget, e.g. 2GiB");
  command.add_option("--report-fd", f.report_fd, "Write trial protocol JSON lines to this file descriptor");
}

std::vector<float> parse_weights(const std::string& text) {
  std::vector<float> weights;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      size_t used = 0;
      weights.push_back(std::stof(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw UsageError("--class-weights: '" + item + "' is not a number");
    }
  }
  return weights;
}

vk::ContextOptions context_options(const TrainFlags& f) {
  vk::ContextOptions options = vk::options_from_environment();
  options.device_index = f.device;
  if (!f.memory_limit.empty()) options.memory_budget = parse_bytes(f.memory_limit, "--device-memory-limit");
  return options;
}

void print_plan(vk::Context& context, const MemoryPlan& plan) {
  nlohmann::json out = {{"device", context.info().name},
                        {"budget_bytes", context.allocator().stats().budget_bytes},
                        {"total_bytes", plan.total()},
                        {"fits", plan.total() <= context.allocator().stats().budget_bytes},
                        {"bytes", plan.bytes}};
  std::printf("%s\n", out.dump().c_str());
  if (isatty(STDOUT_FILENO)) {
    for (auto& [category, bytes] : plan.bytes) std::printf("  %-22s %s\n", category.c_str(), format_bytes(bytes).c_str());
    std::printf("  %-22s %s of %s\n", "total", format_bytes(plan.total()).c_str(),
                format_bytes(context.allocator().stats().budget_bytes).c_str());
  }
}

void run(vk::Context& context, TrainFlags& f, const std::function<void(const nlohmann::json&)>& protocol) {
  if (!f.class_weights.empty()) f.options.class_weights = parse_weights(f.class_weights);
  TrainReporting reporting;
  reporting.protocol = protocol;
  bool features = !f.mil.features.empty();
  if (features && f.mil.labels.empty()) throw UsageError("--features needs --labels slides.csv");
  if (f.options.dry_run) {
    auto plan = features ? plan_mil(context, f.options, f.mil) : plan_training(context, f.options);
    print_plan(context, plan);
    if (plan.total() > context.allocator().stats().budget_bytes)
      throw OutOfDeviceMemory("the plan (" + format_bytes(plan.total()) + ") is over the device memory budget (" +
                              format_bytes(context.allocator().stats().budget_bytes) + ")");
    return;
  }
  if (features)
    train_mil(context, f.options, f.mil, reporting);
  else
    train(context, f.options, reporting);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* command = app.add_subcommand("train", "Train a CNN on patches (PCam-layout HDF5 or LMDB tile store)");
  auto flags = std::make_shared<TrainFlags>();
  add_train_flags(*command, *flags);
  command->callback([flags] {
    std::FILE* report = nullptr;
    if (flags->report_fd >= 0) {
      report = fdopen(flags->report_fd, "w");
      if (!report) throw UsageError("--report-fd " + std::to_string(flags->report_fd) + ": not an open file descriptor");
    }
    vk::Context context(context_options(*flags));
    run(context, *flags, [report](const nlohmann::json& line) {
      if (!report) return;
      std::fprintf(report, "%s\n", line.dump().c_str());
      std::fflush(report);
    });
  });
}

int run_train_in_process(const std::vector<std::string>& args,
                         const std::function<void(const std::string& json_line)>& report) {
  // One device for every trial of the process, as an in-process search would have it.
  static std::unique_ptr<vk::Context> shared;
  CLI::App app{"tessera train (in process)"};
  TrainFlags flags;
  add_train_flags(app, flags);
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
    if (!shared) shared = std::make_unique<vk::Context>(context_options(flags));
    if (!flags.memory_limit.empty())
      shared->allocator().set_budget(parse_bytes(flags.memory_limit, "--device-memory-limit"));
    run(*shared, flags, [&](const nlohmann::json& line) { report(line.dump()); });
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tessera train: %s\n", e.what());
    return static_cast<int>(ExitCode::bad_usage);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera train: %s\n", e.what());
    return exit_code_of(e);
  }
}

}  // namespace tessera::cli
