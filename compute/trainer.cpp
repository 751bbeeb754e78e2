#include "compute/trainer.h"

#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/progress.h"
#include "common/units.h"
#include "compute/loss_scale.h"
#include "compute/release_wait.h"
#include "compute/roc_auc.h"
#include "compute/run_checks.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// Test-only faults for the sweep's tests (TESSERA_FAULT): a trial that leaks device memory,
// crashes, hangs, runs out of memory or diverges, each through the real code path.
void inject_fault_before_training(vk::Context& context) {
  const char* fault = std::getenv("TESSERA_FAULT");
  if (!fault) return;
  std::string kind = fault;
  if (kind.rfind("leak:", 0) == 0) {
    uint64_t bytes = parse_bytes(kind.substr(5), "TESSERA_FAULT=leak");
    // Deliberately never freed: in one process (the sweep's --isolation none) leaks add up.
    (void)new Tensor(context, "leaked by TESSERA_FAULT", {static_cast<int64_t>(bytes / 4)});
  } else if (kind == "segfault") {
    std::raise(SIGSEGV);
  } else if (kind == "hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  } else if (kind == "oom") {
    Tensor too_big(context, "TESSERA_FAULT=oom", {static_cast<int64_t>(context.allocator().stats().budget_bytes / 4 + 1)});
  } else if (kind.rfind("wait:", 0) == 0) {
    wait_for_release(kind.substr(5));
  } else if (kind != "nan" && kind.rfind("loss_scale:", 0) != 0) {
    throw UsageError("TESSERA_FAULT=" + kind +
                     ": not a fault (leak:BYTES, segfault, hang, oom, nan, wait:DIR, loss_scale:VALUE)");
  }
}

// The loss scale a mixed-precision run starts from: GradScaler's 65536, or with
// TESSERA_FAULT=loss_scale:VALUE one so large that the first steps' gradients overflow fp16.
float initial_loss_scale() {
  const char* fault = std::getenv("TESSERA_FAULT");
  if (fault && std::strncmp(fault, "loss_scale:", 11) == 0) return std::strtof(fault + 11, nullptr);
  return LossScaleState{}.scale;
}

bool nan_fault() {
  const char* fault = std::getenv("TESSERA_FAULT");
  return fault && std::strcmp(fault, "nan") == 0;
}

// Tensors the loop allocates beside the graph, named as in the plan.
struct LoopTensor {
  std::string name;
  Shape shape;
  DType dtype;
  vk::MemoryUsage usage;
  std::string category;
};

std::string suffix(int slot, int k) { return "." + std::to_string(slot) + "." + std::to_string(k); }

nlohmann::json loss_layers(const nlohmann::json& graph) {
  std::string logits = graph["layers"].back()["name"];
  return nlohmann::json::array(
      {{{"name", "loss"}, {"type", "softmax_cross_entropy"}, {"inputs", {logits, "labels"}}}});
}

}  // namespace

struct TrainingLoop::State {
  State(vk::Context& run_context, const TrainOptions& run_options, TrainingJob run_job)
      : context(run_context),
        options(run_options),
        job(std::move(run_job)),
        network(job.graph, job.staged, true, job.prologue, loss_layers(job.graph)),
        logits(network.layer(job.graph["layers"].back()["name"].get<std::string>())),
        optimizer(Optimizer::make(options.optimizer)) {
    network.set_activation_dtype(options.fp16 ? DType::f16 : DType::f32);
  }

  int64_t batch() const {
    for (auto& input : job.staged)
      if (input.name == "labels") return input.shape[0];
    throw std::logic_error("a training job stages no labels");
  }

  // Two slots of staged inputs (one filled while the other's step runs) of K micro-batches.
  std::vector<LoopTensor> loop_tensors() const {
    std::vector<LoopTensor> tensors;
    for (int slot = 0; slot < 2; ++slot)
      for (int k = 0; k < options.accumulate; ++k)
        for (auto& input : job.staged)
          tensors.push_back({input.name + suffix(slot, k), input.shape, input.dtype, vk::MemoryUsage::staging, "staging"});
    tensors.push_back({"metrics", {4}, DType::f32, vk::MemoryUsage::staging, "staging"});
    tensors.push_back({"step", {2}, DType::u32, vk::MemoryUsage::device, "optimizer state"});
    if (options.fp16)
      tensors.push_back({"loss_scale", LossScale::shape(), DType::f32, vk::MemoryUsage::device, "optimizer state"});
    return tensors;
  }

  MemoryPlan plan() const {
    auto& allocator = context.allocator();
    MemoryPlan plan = network.plan(allocator);
    auto bytes = [&](const Shape& shape, DType dtype) {
      return allocator.footprint(static_cast<uint64_t>(element_count(shape)) * element_size(dtype));
    };
    for (auto& t : loop_tensors()) plan.bytes[t.category] += bytes(t.shape, t.dtype);
    // Uploads and checkpoint downloads stage one tensor at a time; the largest is a parameter or state.
    uint64_t largest = 0;
    for (auto& layer : network.layers())
      for (auto& spec : layer.specs)
        if (spec.role != TensorRole::saved)
          largest = std::max(largest, static_cast<uint64_t>(element_count(spec.shape)) * element_size(spec.dtype));
    plan.bytes["staging"] += allocator.transfer_footprint(largest);
    for (auto& layer : network.layers())
      for (auto& spec : layer.specs)
        if (spec.role == TensorRole::parameter)
          for (auto& state : optimizer->state(spec)) plan.bytes["optimizer state"] += bytes(state.shape, state.dtype);
    return plan;
  }

  void allocate() {
    network.allocate(context);
    for (auto& t : loop_tensors()) extra[t.name] = std::make_unique<Tensor>(context, t.name, t.shape, t.dtype, t.usage);
    if (options.fp16) loss_scale.emplace(*extra["loss_scale"]);
    for (auto& named : network.named_tensors()) {
      if (!named.grad) continue;
      auto& states = optimizer_states[named.name];
      for (auto& spec : optimizer->state(named.spec))
        states.push_back(std::make_unique<Tensor>(context, named.name + "." + spec.name, spec.shape, spec.dtype));
    }
  }

  void initialise() {
    network.initialise(options.seed);
    Network::Layer& loss = network.layer("loss");
    if (!options.class_weights.empty()) {
      auto classes = static_cast<size_t>(loss.tensors[0]->count());
      if (options.class_weights.size() != classes)
        throw UsageError("--class-weights has " + std::to_string(options.class_weights.size()) +
                         " values; the data has " + std::to_string(classes) + " classes");
      loss.tensors[0]->upload(options.class_weights);
    }
    // The loss is the sum of per-sample terms; each micro-batch adds 1/K of its gradient.
    loss.output_grad->upload(
        std::vector<float>(static_cast<size_t>(batch()), 1.0f / static_cast<float>(options.accumulate)));
    for (auto& [name, states] : optimizer_states)
      for (auto& state : states) state->upload(std::vector<float>(static_cast<size_t>(state->count()), 0.0f));
    uint32_t step[2] = {0, 0};
    extra["step"]->upload(step, sizeof step);
    if (loss_scale) loss_scale->upload({initial_loss_scale()});
    if (job.start) restore(*job.start);
  }

  Network::Bound bound(int slot, int k) {
    Network::Bound inputs;
    for (auto& input : job.staged) inputs[input.name] = extra[input.name + suffix(slot, k)].get();
    return inputs;
  }

  std::map<std::string, const Tensor*> staged(int slot, int k) {
    auto inputs = bound(slot, k);
    return {inputs.begin(), inputs.end()};
  }

  void record() {
    auto& kernels = context.kernels();
    const Tensor& step = *extra["step"];
    for (int slot = 0; slot < 2; ++slot) {
      for (int k = 0; k < options.accumulate; ++k) {
        train_programs[slot].push_back(std::make_unique<vk::Program>(context));
        vk::Recorder recorder(context, *train_programs[slot].back());
        Network::Pass pass{true, options.seed, &step, static_cast<uint32_t>(k * batch())};
        auto inputs = bound(slot, k);
        network.record_forward(recorder, kernels, inputs, pass);
        record_metrics(recorder, slot, k);
        if (loss_scale) {
          recorder.set_scope("loss scale");
          loss_scale->record_loss_gradient(recorder, kernels, *network.layer("loss").output_grad,
                                           1.0f / static_cast<float>(options.accumulate));
        }
        network.record_backward(recorder, kernels, inputs, pass);
        if (k == options.accumulate - 1) {
          auto named_tensors = network.named_tensors();
          if (loss_scale) {
            recorder.set_scope("loss scale");
            for (auto& named : named_tensors)
              if (named.grad) loss_scale->record_check(recorder, kernels, *named.grad);
          }
          recorder.set_scope("optimizer");
          for (auto& named : named_tensors) {
            if (!named.grad) continue;
            std::vector<const Tensor*> states;
            for (auto& s : optimizer_states[named.name]) states.push_back(s.get());
            optimizer->record_update(recorder, kernels, *named.tensor, *named.grad, states, step,
                                     loss_scale ? extra["loss_scale"].get() : nullptr);
          }
          Optimizer::record_step_advance(recorder, kernels, step);
          if (loss_scale) loss_scale->record_update(recorder, kernels);
        }
        recorder.finish();
      }
      eval_programs[slot] = std::make_unique<vk::Program>(context);
      vk::Recorder recorder(context, *eval_programs[slot]);
      network.record_forward(recorder, kernels, bound(slot, 0), Network::Pass{false, options.seed, &step, 0});
      record_metrics(recorder, slot, 0);
      recorder.finish();
    }
  }

  void record_metrics(vk::Recorder& recorder, int slot, int k) {
    struct Push {
      uint32_t classes;
    } push{static_cast<uint32_t>(logits.output_shape[1])};
    recorder.set_scope("metrics");
    recorder.dispatch(kernel_for(context.kernels(), "metrics_accumulate", *logits.output),
                      {reads(*logits.output), vk::reads(extra["labels" + suffix(slot, k)]->buffer()),
                       vk::reads(extra["valid" + suffix(slot, k)]->buffer()), vk::updates(extra["metrics"]->buffer())},
                      push, 1);
    recorder.set_scope("");
  }

  // NaN in the last parameter reaches the logits unchanged (a max or a ReLU earlier on
  // would turn it back into a number), so the loss is NaN from the first step.
  void inject_nan() {
    auto named = network.named_tensors();
    std::vector<float> values(static_cast<size_t>(named.back().tensor->count()), std::nanf(""));
    named.back().tensor->upload(values);
  }

  void train(Feed& train_feed, Feed& validation_feed, const TrainReporting& reporting) {
    int first_epoch = 0;
    if (job.start && job.start->progress.is_object()) first_epoch = job.start->progress.value("epoch", 0);
    size_t steps = train_feed.batches_per_epoch() / static_cast<size_t>(options.accumulate);
    uint64_t total_steps = steps * static_cast<uint64_t>(options.epochs - first_epoch);
    std::unique_ptr<Progress> progress;
    if (reporting.progress) progress = std::make_unique<Progress>("train", total_steps);
    nlohmann::json last;
    double wait_seconds = 0, run_seconds = 0;
    uint64_t done = 0;
    for (int epoch = first_epoch; epoch < options.epochs; ++epoch) {
      auto epoch_start = Clock::now();
      train_feed.start_epoch(static_cast<uint32_t>(epoch));
      reset_metrics();
      for (size_t step = 0; step < steps; ++step) {
        int slot = static_cast<int>(step % 2);
        for (int k = 0; k < options.accumulate; ++k) {
          auto& program = *train_programs[slot][static_cast<size_t>(k)];
          program.wait();
          auto before = Clock::now();
          if (!train_feed.next(staged(slot, k))) throw std::logic_error("the feed ended before its batches_per_epoch");
          wait_seconds += std::chrono::duration<double>(Clock::now() - before).count();
          program.submit();
        }
        ++done;
        if (progress && (step + 1) % 20 == 0) {
          auto m = read_metrics();
          check_finite(m[0], epoch, step);
          progress->update(done, {{"epoch", epoch + 1}, {"loss", m[0] / std::max(1.0, m[2])}});
        }
      }
      auto train_metrics = read_metrics();
      check_finite(train_metrics[0], epoch, steps);
      if (progress) progress->update(done);
      double train_seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      run_seconds += train_seconds;
      auto val_metrics = evaluate(validation_feed, epoch);
      double samples = std::max(1.0, train_metrics[2]), val_samples = std::max(1.0, val_metrics[2]);
      last = {{"event", "epoch"},
              {"epoch", epoch + 1},
              {"train_loss", train_metrics[0] / samples},
              {"train_accuracy", train_metrics[1] / samples},
              {"val_loss", val_metrics[2] > 0 ? nlohmann::json(val_metrics[0] / val_samples) : nlohmann::json()},
              {"val_accuracy", val_metrics[2] > 0 ? nlohmann::json(val_metrics[1] / val_samples) : nlohmann::json()},
              {"images_per_second", train_metrics[2] / train_seconds},
              {"data_wait_fraction", run_seconds > 0 ? wait_seconds / run_seconds : 0.0},
              {"peak_device_bytes", context.allocator().stats().peak_bytes}};
      if (auto auc = val_scores.auc()) last["val_auc"] = *auc;
      if (loss_scale) {
        auto scaling = loss_scale->download();
        last["loss_scale"] = scaling.scale;
        last["skipped_steps"] = scaling.skipped_steps;
      }
      last.update(job.report);
      if (progress) progress->event(last);
      if (reporting.protocol) {
        double value = val_metrics[2] > 0 ? val_metrics[0] / val_samples : train_metrics[0] / samples;
        reporting.protocol({{"type", "intermediate"}, {"step", epoch + 1}, {"value", value}, {"metrics", last}});
      }
      check_finite_state(download_tensors(checkpoint_tensors()), download_tensors(train_tensors()), epoch + 1);
      if (!options.checkpoint.empty()) save(epoch + 1, last);
    }
    if (progress) progress->finish();
    if (reporting.protocol && last.is_object()) {
      double value = last["val_loss"].is_number() ? last["val_loss"].get<double>() : last.value("train_loss", 0.0);
      reporting.protocol({{"type", "final"},
                          {"value", value},
                          {"metrics", last},
                          {"peak_device_bytes", context.allocator().stats().peak_bytes},
                          {"device", context.info().name}});
    }
  }

  void wait_all() {
    for (auto& programs : train_programs)
      for (auto& p : programs) p->wait();
    for (auto& p : eval_programs)
      if (p) p->wait();
  }

  void reset_metrics() {
    wait_all();
    std::memset(extra["metrics"]->buffer().mapped(), 0, 16);
  }

  std::array<double, 3> read_metrics() {
    wait_all();
    float m[4];
    std::memcpy(m, extra["metrics"]->buffer().mapped(), 16);
    return {m[0], m[1], m[2]};
  }

  void check_finite(double loss_sum, int epoch, size_t step) {
    if (!std::isfinite(loss_sum))
      throw Diverged("training diverged: the loss is not finite in epoch " + std::to_string(epoch + 1) + " by step " +
                     std::to_string(step) + " (try a lower --lr)");
  }

  // val_auc of a two-class model: the slot's logits and labels, read back before it is refilled.
  void score(int slot) {
    eval_programs[slot]->wait();
    const Tensor& labels = *extra.at("labels" + suffix(slot, 0));
    std::vector<uint32_t> label_values(static_cast<size_t>(labels.count()));
    labels.download(label_values.data(), labels.bytes());
    uint32_t valid = 0;
    extra.at("valid" + suffix(slot, 0))->download(&valid, sizeof valid);
    val_scores.add(logits.output->download(), label_values, valid);
  }

  std::array<double, 3> evaluate(Feed& feed, int epoch) {
    reset_metrics();
    val_scores.clear();
    feed.start_epoch(static_cast<uint32_t>(epoch));
    for (size_t b = 0;; ++b) {
      int slot = static_cast<int>(b % 2);
      eval_programs[slot]->wait();
      if (!feed.next(staged(slot, 0))) break;
      eval_programs[slot]->submit();
      if (logits.output_shape[1] == 2) score(slot);
    }
    return read_metrics();
  }

  std::map<std::string, Tensor*> checkpoint_tensors() {
    std::map<std::string, Tensor*> tensors;
    for (auto& named : network.named_tensors()) tensors[named.name] = named.tensor;
    return tensors;
  }

  std::map<std::string, Tensor*> train_tensors() {
    std::map<std::string, Tensor*> tensors{{"step", extra["step"].get()}};
    if (loss_scale) tensors["loss_scale"] = extra["loss_scale"].get();
    for (auto& [name, states] : optimizer_states)
      for (auto& state : states) tensors["optimizer/" + state->name()] = state.get();
    return tensors;
  }

  void save(int epochs_done, const nlohmann::json& metrics) {
    wait_all();
    Checkpoint checkpoint;
    checkpoint.model = job.model;
    checkpoint.params = download_tensors(checkpoint_tensors());
    checkpoint.train = download_tensors(train_tensors());
    checkpoint.progress = run_settings(options);
    checkpoint.progress.update({{"epoch", epochs_done}, {"metrics", metrics}});
    write_checkpoint(options.checkpoint, checkpoint);
  }

  void restore(const Checkpoint& checkpoint) {
    load_tensors(checkpoint.params, checkpoint_tensors(), job.start_path, "params");
    if (!checkpoint.train.empty()) load_tensors(checkpoint.train, train_tensors(), job.start_path, "train");
  }

  vk::Context& context;
  const TrainOptions& options;
  TrainingJob job;
  Network network;
  Network::Layer& logits;
  std::unique_ptr<Optimizer> optimizer;
  std::map<std::string, std::unique_ptr<Tensor>> extra;
  std::optional<LossScale> loss_scale;  // mixed precision
  BinaryScores val_scores;
  std::map<std::string, std::vector<std::unique_ptr<Tensor>>> optimizer_states;
  std::array<std::vector<std::unique_ptr<vk::Program>>, 2> train_programs;
  std::array<std::unique_ptr<vk::Program>, 2> eval_programs;
};

TrainingLoop::TrainingLoop(vk::Context& context, const TrainOptions& options, TrainingJob job)
    : state_(std::make_unique<State>(context, options, std::move(job))) {}

int64_t TrainingLoop::classes() const { return state_->logits.output_shape[1]; }

TrainingLoop::~TrainingLoop() {
  if (state_) state_->wait_all();
}

MemoryPlan TrainingLoop::plan() const { return state_->plan(); }

void TrainingLoop::run(Feed& train, Feed& validation, const TrainReporting& reporting) {
  check_plan_fits(state_->context, plan(), state_->job.advice);
  inject_fault_before_training(state_->context);
  state_->allocate();
  state_->initialise();
  if (nan_fault()) state_->inject_nan();
  state_->record();
  state_->train(train, validation, reporting);
}

void check_plan_fits(vk::Context& context, const MemoryPlan& plan, const std::string& advice) {
  uint64_t budget = context.allocator().stats().budget_bytes;
  uint64_t in_use = context.allocator().stats().live_bytes;
  if (in_use + plan.total() > budget)
    throw OutOfDeviceMemory("the run needs " + format_bytes(plan.total()) + " of device memory" +
                            (in_use ? " with " + format_bytes(in_use) + " already in use" : std::string()) +
                            "; the budget is " + format_bytes(budget) + " (" + advice + ")");
}

}  // namespace tessera
