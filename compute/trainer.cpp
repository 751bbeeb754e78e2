#include "compute/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/error.h"
#include "common/progress.h"
#include "common/units.h"
#include "compute/checkpoint.h"
#include "compute/input_normalize.h"
#include "compute/ops/registry.h"
#include "compute/run_checks.h"
#include "data/loader.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// The data and the model as the run will use them.
struct Setup {
  std::unique_ptr<data::PatchSource> source;
  std::vector<size_t> train_indices, val_indices;
  nlohmann::json description;
  std::optional<Checkpoint> start;  // --model CKPT.h5 or --resume
};

Setup prepare(const TrainOptions& options) {
  if (options.batch < 1) throw UsageError("--batch must be at least 1");
  if (options.accumulate < 1) throw UsageError("--accumulate must be at least 1");
  if (options.epochs < 1) throw UsageError("--epochs must be at least 1");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) throw UsageError("--val-fraction must be in [0, 1)");
  if (options.resume && options.checkpoint.empty()) throw UsageError("--resume needs --checkpoint PATH");
  Setup setup;
  setup.source = data::open_patches(options.data);
  if (setup.source->size() == 0) throw BadInput(options.data + ": holds no patches");
  data::split_by_group(*setup.source, options.val_fraction, setup.train_indices, setup.val_indices);
  check_training_patches(*setup.source, options, setup.train_indices.size(), setup.val_indices.size());
  int classes = static_cast<int>(std::max<uint32_t>(setup.source->class_count(), 2));
  if (options.resume && std::filesystem::exists(options.checkpoint)) {
    setup.start = read_checkpoint(options.checkpoint);
    setup.description = setup.start->model;
  } else if (is_checkpoint_path(options.model)) {
    setup.start = read_checkpoint(options.model);
    setup.start->train.clear();  // weights only: a new run from pretrained parameters
    setup.start->progress = nullptr;
    setup.description = expand_presets(setup.start->model);
  } else {
    setup.description = load_model_description(options.model, classes, options.width);
  }
  return setup;
}

Shape input_shape(const Setup& setup, const TrainOptions& options) {
  return {options.batch, 3, setup.source->height(), setup.source->width()};
}

// Everything the run allocates besides the network, named as in the plan.
struct ExtraTensor {
  std::string name;
  Shape shape;
  DType dtype;
  vk::MemoryUsage usage;
  std::string category;
};

std::vector<ExtraTensor> extra_tensors(const Shape& input, int accumulate) {
  std::vector<ExtraTensor> extra;
  int64_t n = input[0], h = input[2], w = input[3];
  for (int slot = 0; slot < 2; ++slot)
    for (int k = 0; k < accumulate; ++k) {
      std::string suffix = "." + std::to_string(slot) + "." + std::to_string(k);
      extra.push_back({"images" + suffix, {n, h, w, 3}, DType::u8, vk::MemoryUsage::staging, "staging"});
      extra.push_back({"labels" + suffix, {n}, DType::u32, vk::MemoryUsage::staging, "staging"});
      extra.push_back({"valid" + suffix, {1}, DType::u32, vk::MemoryUsage::staging, "staging"});
    }
  extra.push_back({"metrics", {4}, DType::f32, vk::MemoryUsage::staging, "staging"});
  extra.push_back({"input", input, DType::f32, vk::MemoryUsage::device, "activations"});
  extra.push_back({"loss", {n}, DType::f32, vk::MemoryUsage::device, "activations"});
  extra.push_back({"loss.grad", {n}, DType::f32, vk::MemoryUsage::device, "activation gradients"});
  extra.push_back({"step", {2}, DType::u32, vk::MemoryUsage::device, "optimizer state"});
  return extra;
}

nlohmann::json loss_layer() { return {{"name", "loss"}, {"type", "softmax_cross_entropy"}}; }

MemoryPlan make_plan(vk::Context& context, Network& network, Op& loss, Optimizer& optimizer, const Shape& input,
                     int accumulate) {
  MemoryPlan plan;
  auto& allocator = context.allocator();
  for (auto& t : network.planned_tensors())
    plan.bytes[t.category] += allocator.footprint(static_cast<uint64_t>(element_count(t.shape)) * element_size(t.dtype));
  for (auto& spec : loss.tensors())
    plan.bytes["activations"] += allocator.footprint(static_cast<uint64_t>(element_count(spec.shape)) * element_size(spec.dtype));
  for (auto& t : extra_tensors(input, accumulate))
    plan.bytes[t.category] += allocator.footprint(static_cast<uint64_t>(element_count(t.shape)) * element_size(t.dtype));
  // Uploads and checkpoint downloads stage one tensor at a time; the largest is a parameter or state.
  uint64_t largest = 0;
  for (auto& t : network.planned_tensors())
    if (t.category != "activations" && t.category != "activation gradients")
      largest = std::max<uint64_t>(largest, static_cast<uint64_t>(element_count(t.shape)) * element_size(t.dtype));
  plan.bytes["staging"] += allocator.transfer_footprint(largest);
  for (auto& layer : network.layers())
    for (auto& spec : layer.specs)
      if (spec.role == TensorRole::parameter)
        for (auto& state : optimizer.state(spec))
          plan.bytes["optimizer state"] += allocator.footprint(static_cast<uint64_t>(element_count(state.shape)) * element_size(state.dtype));
  return plan;
}

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
  } else if (kind != "nan") {
    throw UsageError("TESSERA_FAULT=" + kind + ": not a fault (leak:BYTES, segfault, hang, oom, nan)");
  }
}

bool nan_fault() {
  const char* fault = std::getenv("TESSERA_FAULT");
  return fault && std::strcmp(fault, "nan") == 0;
}

class Run {
 public:
  Run(vk::Context& context, const TrainOptions& options, Setup setup)
      : context_(context),
        options_(options),
        setup_(std::move(setup)),
        input_shape_(input_shape(setup_, options)),
        network_(setup_.description, input_shape_, true),
        loss_(make_op(LayerConfig(loss_layer()))),
        optimizer_(Optimizer::make(options.optimizer)) {
    loss_->infer({network_.output_shape(), {input_shape_[0]}});  // fixes the loss op's shapes
    check_labels_fit(*setup_.source, network_.output_shape()[1], options.data);
  }

  MemoryPlan plan() {
    return make_plan(context_, network_, *loss_, *optimizer_, input_shape_, options_.accumulate);
  }

  void allocate() {
    network_.allocate(context_);
    for (auto& t : extra_tensors(input_shape_, options_.accumulate))
      extra_[t.name] = std::make_unique<Tensor>(context_, t.name, t.shape, t.dtype, t.usage);
    for (auto& spec : loss_->tensors())
      loss_tensors_.push_back(std::make_unique<Tensor>(context_, "loss." + spec.name, spec.shape, spec.dtype));
    for (auto& named : network_.named_tensors()) {
      if (!named.grad) continue;
      auto& states = optimizer_states_[named.name];
      for (auto& spec : optimizer_->state(named.spec))
        states.push_back(std::make_unique<Tensor>(context_, named.name + "." + spec.name, spec.shape, spec.dtype));
    }
  }

  void initialise() {
    network_.initialise(options_.seed);
    for (size_t s = 0; s < loss_tensors_.size(); ++s) {
      std::vector<float> weights(static_cast<size_t>(loss_tensors_[s]->count()), 1.0f);
      if (!options_.class_weights.empty()) {
        if (options_.class_weights.size() != weights.size())
          throw UsageError("--class-weights has " + std::to_string(options_.class_weights.size()) +
                           " values; the data has " + std::to_string(weights.size()) + " classes");
        weights = options_.class_weights;
      }
      loss_tensors_[s]->upload(weights);
    }
    std::vector<float> loss_grad(static_cast<size_t>(input_shape_[0]), 1.0f / static_cast<float>(options_.accumulate));
    extra_["loss.grad"]->upload(loss_grad);
    for (auto& [name, states] : optimizer_states_)
      for (auto& state : states) state->upload(std::vector<float>(static_cast<size_t>(state->count()), 0.0f));
    uint32_t step[2] = {0, 0};
    extra_["step"]->upload(step, sizeof step);
    if (setup_.start) restore(*setup_.start);
  }

  void record() {
    auto& kernels = context_.kernels();
    for (int slot = 0; slot < 2; ++slot) {
      for (int k = 0; k < options_.accumulate; ++k) {
        train_programs_[slot].push_back(std::make_unique<vk::Program>(context_));
        vk::Recorder recorder(context_, *train_programs_[slot].back());
        std::string suffix = "." + std::to_string(slot) + "." + std::to_string(k);
        uint32_t offset = static_cast<uint32_t>(k * options_.batch);
        record_normalize(recorder, *extra_["images" + suffix]);
        auto& step = *extra_["step"];
        network_.record_forward(recorder, kernels, *extra_["input"], true, options_.seed, step, offset);
        OpTensors loss = loss_bindings(*extra_["labels" + suffix]);
        loss_->forward(recorder, kernels, loss);
        record_metrics(recorder, *extra_["labels" + suffix], *extra_["valid" + suffix]);
        loss_->backward(recorder, kernels, loss);
        network_.record_backward(recorder, kernels, *extra_["input"], options_.seed, step, offset);
        if (k == options_.accumulate - 1) {
          recorder.set_scope("optimizer");
          for (auto& named : network_.named_tensors()) {
            if (!named.grad) continue;
            std::vector<const Tensor*> states;
            for (auto& s : optimizer_states_[named.name]) states.push_back(s.get());
            optimizer_->record_update(recorder, kernels, *named.tensor, *named.grad, states, step);
          }
          Optimizer::record_step_advance(recorder, kernels, step);
        }
        recorder.finish();
      }
      eval_programs_[slot] = std::make_unique<vk::Program>(context_);
      vk::Recorder recorder(context_, *eval_programs_[slot]);
      std::string suffix = "." + std::to_string(slot) + ".0";
      record_normalize(recorder, *extra_["images" + suffix]);
      network_.record_forward(recorder, kernels, *extra_["input"], false, options_.seed, *extra_["step"], 0);
      record_metrics(recorder, *extra_["labels" + suffix], *extra_["valid" + suffix]);
      recorder.finish();
    }
  }

  void run(const TrainReporting& reporting) {
    int first_epoch = 0;
    if (setup_.start && setup_.start->progress.is_object()) first_epoch = setup_.start->progress.value("epoch", 0);
    data::LoaderOptions train_loading{static_cast<size_t>(options_.batch), true, true, options_.augment,
                                      options_.seed, options_.workers, 4};
    data::LoaderOptions val_loading{static_cast<size_t>(options_.batch), false, false, false, options_.seed,
                                    options_.workers, 4};
    data::Loader train_loader(*setup_.source, setup_.train_indices, train_loading);
    data::Loader val_loader(*setup_.source, setup_.val_indices, val_loading);
    size_t steps = train_loader.batches_per_epoch() / static_cast<size_t>(options_.accumulate);
    uint64_t total_steps = steps * static_cast<uint64_t>(options_.epochs - first_epoch);
    std::unique_ptr<Progress> progress;
    if (reporting.progress) progress = std::make_unique<Progress>("train", total_steps);
    nlohmann::json last;
    double wait_seconds = 0, run_seconds = 0;
    uint64_t done = 0;
    for (int epoch = first_epoch; epoch < options_.epochs; ++epoch) {
      auto epoch_start = Clock::now();
      train_loader.start_epoch(static_cast<uint32_t>(epoch));
      reset_metrics();
      data::Batch batch;
      for (size_t step = 0; step < steps; ++step) {
        int slot = static_cast<int>(step % 2);
        for (int k = 0; k < options_.accumulate; ++k) {
          auto& program = *train_programs_[slot][static_cast<size_t>(k)];
          program.wait();
          auto before = Clock::now();
          train_loader.next(batch);
          wait_seconds += std::chrono::duration<double>(Clock::now() - before).count();
          stage(batch, slot, k);
          program.submit();
        }
        ++done;
        if (progress && (step + 1) % 20 == 0) {
          auto m = read_metrics();
          check_finite(m[0], epoch, step);
          progress->update(done, {{"epoch", epoch + 1}, {"loss", m[0] / std::max(1.0, m[2]) }});
        }
      }
      auto train_metrics = read_metrics();
      check_finite(train_metrics[0], epoch, steps);
      if (progress) progress->update(done);
      double train_seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      run_seconds += train_seconds;
      auto val_metrics = evaluate(val_loader, epoch);
      double samples = std::max(1.0, train_metrics[2]), val_samples = std::max(1.0, val_metrics[2]);
      last = {{"event", "epoch"},
              {"epoch", epoch + 1},
              {"train_loss", train_metrics[0] / samples},
              {"train_accuracy", train_metrics[1] / samples},
              {"val_loss", val_metrics[2] > 0 ? nlohmann::json(val_metrics[0] / val_samples) : nlohmann::json()},
              {"val_accuracy", val_metrics[2] > 0 ? nlohmann::json(val_metrics[1] / val_samples) : nlohmann::json()},
              {"images_per_second", train_metrics[2] / train_seconds},
              {"data_wait_fraction", run_seconds > 0 ? wait_seconds / run_seconds : 0.0},
              {"peak_device_bytes", context_.allocator().stats().peak_bytes}};
      if (progress) progress->event(last);
      if (reporting.protocol) {
        double value = val_metrics[2] > 0 ? val_metrics[0] / val_samples : train_metrics[0] / samples;
        reporting.protocol({{"type", "intermediate"}, {"step", epoch + 1}, {"value", value}});
      }
      check_finite_state(download_tensors(checkpoint_tensors()), download_tensors(train_tensors()), epoch + 1);
      if (!options_.checkpoint.empty()) save(options_.checkpoint, epoch + 1, last);
    }
    if (progress) progress->finish();
    if (reporting.protocol) {
      double value = last["val_loss"].is_number() ? last["val_loss"].get<double>() : last.value("train_loss", 0.0);
      reporting.protocol({{"type", "final"},
                          {"value", value},
                          {"metrics", last},
                          {"peak_device_bytes", context_.allocator().stats().peak_bytes},
                          {"device", context_.info().name}});
    }
  }

  // NaN in the last parameter reaches the logits unchanged (a max or a ReLU earlier on
  // would turn it back into a number), so the loss is NaN from the first step.
  void inject_nan() {
    auto named = network_.named_tensors();
    std::vector<float> values(static_cast<size_t>(named.back().tensor->count()), std::nanf(""));
    named.back().tensor->upload(values);
  }

 private:
  void record_normalize(vk::Recorder& recorder, const Tensor& images) {
    record_input_normalize(recorder, context_.kernels(), images, *extra_["input"]);
  }

  void record_metrics(vk::Recorder& recorder, const Tensor& labels, const Tensor& valid) {
    struct Push {
      uint32_t classes;
    } push{static_cast<uint32_t>(network_.output_shape()[1])};
    recorder.dispatch(context_.kernels().get("metrics_accumulate"),
                      {vk::reads(network_.output().buffer()), vk::reads(labels.buffer()), vk::reads(valid.buffer()),
                       vk::updates(extra_["metrics"]->buffer())},
                      push, 1);
  }

  OpTensors loss_bindings(const Tensor& labels) {
    OpTensors t;
    t.inputs = {&network_.output(), &labels};
    t.input_grads = {&network_.output_grad(), nullptr};
    t.accumulate_input_grads = {false, false};
    t.output = extra_["loss"].get();
    t.output_grad = extra_["loss.grad"].get();
    for (auto& tensor : loss_tensors_) {
      t.tensors.push_back(tensor.get());
      t.grads.push_back(nullptr);
    }
    t.step = extra_["step"].get();
    return t;
  }

  void stage(const data::Batch& batch, int slot, int k) {
    std::string suffix = "." + std::to_string(slot) + "." + std::to_string(k);
    std::memcpy(extra_["images" + suffix]->buffer().mapped(), batch.images.data(), batch.images.size());
    std::memcpy(extra_["labels" + suffix]->buffer().mapped(), batch.labels.data(), batch.labels.size() * 4);
    auto valid = static_cast<uint32_t>(batch.count);
    std::memcpy(extra_["valid" + suffix]->buffer().mapped(), &valid, 4);
  }

  void wait_all() {
    for (auto& programs : train_programs_)
      for (auto& p : programs) p->wait();
    for (auto& p : eval_programs_) p->wait();
  }

  void reset_metrics() {
    wait_all();
    std::memset(extra_["metrics"]->buffer().mapped(), 0, 16);
  }

  std::array<double, 3> read_metrics() {
    wait_all();
    float m[4];
    std::memcpy(m, extra_["metrics"]->buffer().mapped(), 16);
    return {m[0], m[1], m[2]};
  }

  void check_finite(double loss_sum, int epoch, size_t step) {
    if (!std::isfinite(loss_sum))
      throw Diverged("training diverged: the loss is not finite in epoch " + std::to_string(epoch + 1) +
                     " by step " + std::to_string(step) + " (try a lower --lr)");
  }

  std::array<double, 3> evaluate(data::Loader& loader, int epoch) {
    reset_metrics();
    loader.start_epoch(static_cast<uint32_t>(epoch));
    data::Batch batch;
    for (size_t b = 0; loader.next(batch); ++b) {
      int slot = static_cast<int>(b % 2);
      eval_programs_[slot]->wait();
      stage(batch, slot, 0);
      eval_programs_[slot]->submit();
    }
    return read_metrics();
  }

  std::map<std::string, Tensor*> checkpoint_tensors() {
    std::map<std::string, Tensor*> tensors;
    for (auto& named : network_.named_tensors()) tensors[named.name] = named.tensor;
    return tensors;
  }

  std::map<std::string, Tensor*> train_tensors() {
    std::map<std::string, Tensor*> tensors{{"step", extra_["step"].get()}};
    for (auto& [name, states] : optimizer_states_)
      for (auto& state : states) tensors["optimizer/" + state->name()] = state.get();
    return tensors;
  }

  void save(const std::string& path, int epochs_done, const nlohmann::json& metrics) {
    wait_all();
    Checkpoint checkpoint;
    checkpoint.model = network_.description();
    checkpoint.params = download_tensors(checkpoint_tensors());
    checkpoint.train = download_tensors(train_tensors());
    checkpoint.progress = run_settings(options_);
    checkpoint.progress.update({{"epoch", epochs_done}, {"metrics", metrics}});
    write_checkpoint(path, checkpoint);
  }

  void restore(const Checkpoint& checkpoint) {
    std::string file = options_.resume ? options_.checkpoint : options_.model;
    load_tensors(checkpoint.params, checkpoint_tensors(), file, "params");
    if (!checkpoint.train.empty()) load_tensors(checkpoint.train, train_tensors(), file, "train");
  }

  vk::Context& context_;
  const TrainOptions& options_;
  Setup setup_;
  Shape input_shape_;
  Network network_;
  std::unique_ptr<Op> loss_;
  std::unique_ptr<Optimizer> optimizer_;
  std::map<std::string, std::unique_ptr<Tensor>> extra_;
  std::vector<std::unique_ptr<Tensor>> loss_tensors_;
  std::map<std::string, std::vector<std::unique_ptr<Tensor>>> optimizer_states_;
  std::array<std::vector<std::unique_ptr<vk::Program>>, 2> train_programs_;
  std::array<std::unique_ptr<vk::Program>, 2> eval_programs_;
};

}  // namespace

MemoryPlan plan_training(vk::Context& context, const TrainOptions& options) {
  Run run(context, options, prepare(options));
  return run.plan();
}

void check_plan_fits(vk::Context& context, const MemoryPlan& plan, const std::string& advice) {
  uint64_t budget = context.allocator().stats().budget_bytes;
  uint64_t in_use = context.allocator().stats().live_bytes;
  if (in_use + plan.total() > budget)
    throw OutOfDeviceMemory("the run needs " + format_bytes(plan.total()) + " of device memory" +
                            (in_use ? " with " + format_bytes(in_use) + " already in use" : std::string()) +
                            "; the budget is " + format_bytes(budget) + " (" + advice + ")");
}

void train(vk::Context& context, const TrainOptions& options, const TrainReporting& reporting) {
  Run run(context, options, prepare(options));
  check_plan_fits(context, run.plan(), "lower --batch and raise --accumulate, or raise --device-memory-limit");
  inject_fault_before_training(context);
  run.allocate();
  run.initialise();
  if (nan_fault()) run.inject_nan();
  run.record();
  run.run(reporting);
}

}  // namespace tessera
