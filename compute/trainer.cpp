#include "compute/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <thread>

#include "common/error.h"
#include "common/progress.h"
#include "common/units.h"
#include "compute/data_parallel.h"
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
  } else if (kind != "nan" && kind.rfind("nan:", 0) != 0 && kind.rfind("sigkill:", 0) != 0 &&
             kind.rfind("loss_scale:", 0) != 0) {
    throw UsageError("TESSERA_FAULT=" + kind +
                     ": not a fault (leak:BYTES, segfault, hang, oom, nan, nan:TENSOR, wait:DIR, sigkill:EPOCH[:RANK], "
                     "loss_scale:VALUE)");
  }
}

// The loss scale a mixed-precision run starts from: GradScaler's 65536, or with
// TESSERA_FAULT=loss_scale:VALUE one so large that the first steps' gradients overflow fp16.
float initial_loss_scale() {
  const char* fault = std::getenv("TESSERA_FAULT");
  if (fault && std::strncmp(fault, "loss_scale:", 11) == 0) return std::strtof(fault + 11, nullptr);
  return LossScaleState{}.scale;
}

// TESSERA_FAULT=sigkill:EPOCH[:RANK]: the process (only MPI rank RANK's, if given) kills itself
// with SIGKILL once epoch EPOCH is done and checkpointed, as a crash or a killed job would.
void sigkill_fault(int epochs_done, int rank) {
  const char* fault = std::getenv("TESSERA_FAULT");
  int epoch = -1, only_rank = -1;
  if (!fault || std::sscanf(fault, "sigkill:%d:%d", &epoch, &only_rank) < 1) return;
  if (epoch == epochs_done && (only_rank < 0 || only_rank == rank)) std::raise(SIGKILL);
}

// TESSERA_FAULT=nan fills the model's last parameter with NaN (the loss shows it at once);
// nan:TENSOR fills that named tensor, e.g. a running variance that the training loss never reads.
// Returns the tensor to fill, or nothing.
std::optional<std::string> nan_fault() {
  const char* fault = std::getenv("TESSERA_FAULT");
  if (!fault) return std::nullopt;
  if (std::strcmp(fault, "nan") == 0) return std::string();
  if (std::strncmp(fault, "nan:", 4) == 0) return std::string(fault + 4);
  return std::nullopt;
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

// The job's staged inputs for one replica of several, which takes `count` samples of every
// micro-batch: the inputs, all with a leading batch dimension, are cut to it ("valid" stays [1]).
std::vector<GraphInput> part_inputs(std::vector<GraphInput> staged, bool replicated, int64_t count) {
  if (replicated)
    for (auto& input : staged)
      if (input.name != "valid") input.shape[0] = count;
  return staged;
}

// One copy of the model on one device: its network, optimizer state, staged inputs (its part of
// every micro-batch) and recorded programs. Alone, a step is one command buffer per micro-batch
// with the optimizer in the last; replicated, the last also copies the gradients into host memory
// (`gradients`), and the optimizer runs in a program of its own once they are summed. With
// --sync-bn a micro-batch's commands break at every batch norm, where the host combines the
// replicas' statistics (ReplicaSync).
struct Replica final : ReplicaSync {
  Replica(vk::Context& device, const TrainOptions& run_options, const TrainingJob& job, int64_t job_batch,
          BatchPart batch_part, bool run_replicated)
      : context(device),
        options(run_options),
        batch(job_batch),
        part(batch_part),
        replicated(run_replicated),
        staged_inputs(part_inputs(job.staged, replicated, part.count)),
        network(job.graph, staged_inputs, true, job.prologue, loss_layers(job.graph)),
        logits(network.layer(job.graph["layers"].back()["name"].get<std::string>())),
        optimizer(Optimizer::make(options.optimizer)) {
    network.set_activation_dtype(options.fp16 ? DType::f16 : DType::f32);
  }

  // Two slots of staged inputs (one filled while the other's step runs) of K micro-batches.
  std::vector<LoopTensor> loop_tensors() const {
    std::vector<LoopTensor> tensors;
    for (int slot = 0; slot < 2; ++slot)
      for (int k = 0; k < options.accumulate; ++k) {
        for (auto& input : staged_inputs)
          tensors.push_back({input.name + suffix(slot, k), input.shape, input.dtype, vk::MemoryUsage::staging, "staging"});
        // Replicated: the weight of each sample's loss, so that the replicas' gradients sum to the batch's.
        if (replicated) tensors.push_back({"loss_weight" + suffix(slot, k), {part.count}, DType::f32, vk::MemoryUsage::staging, "staging"});
        // --sync-bn: the host's copy of what each batch norm exchanges.
        if (synced())
          for (auto& layer : network.layers())
            for (auto& spec : layer.specs)
              if (spec.name == kExchanged)
                tensors.push_back({layer.name + "." + spec.name + suffix(slot, k), spec.shape, spec.dtype,
                                   vk::MemoryUsage::staging, "gradient exchange"});
      }
    tensors.push_back({"metrics", {4}, DType::f32, vk::MemoryUsage::staging, "staging"});
    tensors.push_back({"step", {2}, DType::u32, vk::MemoryUsage::device, "optimizer state"});
    if (options.fp16)
      tensors.push_back({"loss_scale", LossScale::shape(), DType::f32, vk::MemoryUsage::device, "optimizer state"});
    if (replicated) tensors.push_back({"gradients", {gradient_count()}, DType::f32, vk::MemoryUsage::staging, "gradient exchange"});
    return tensors;
  }

  bool synced() const { return replicated && options.sync_batch_norm; }

  // Layers that exchange values under --sync-bn (batch norms).
  int synced_layers() const {
    int count = 0;
    for (auto& layer : network.layers())
      for (auto& spec : layer.specs) count += spec.name == kExchanged ? 1 : 0;
    return count;
  }

  // Elements of all parameter gradients together: the host copy that replicas sum.
  int64_t gradient_count() const {
    int64_t count = 0;
    for (auto& layer : network.layers())
      for (auto& spec : layer.specs)
        if (spec.role == TensorRole::parameter) count += element_count(spec.shape);
    return count;
  }

  MemoryPlan plan() const {
    auto& allocator = context.allocator();
    // In the order allocate() takes them, so that the plan places them as the allocator will.
    MemoryPlan plan = network.plan(allocator);
    auto bytes = [&](const Shape& shape, DType dtype) {
      return static_cast<uint64_t>(element_count(shape)) * element_size(dtype);
    };
    for (auto& t : loop_tensors()) plan.add(allocator, t.category, bytes(t.shape, t.dtype), t.usage);
    for (auto& layer : network.layers())
      for (auto& spec : layer.specs)
        if (spec.role == TensorRole::parameter)
          for (auto& state : optimizer->state(spec)) plan.add(allocator, "optimizer state", bytes(state.shape, state.dtype));
    // Uploads and checkpoint downloads stage one tensor at a time; the largest is a parameter or state.
    uint64_t largest = 0;
    for (auto& layer : network.layers())
      for (auto& spec : layer.specs)
        if (spec.role != TensorRole::saved) largest = std::max(largest, bytes(spec.shape, spec.dtype));
    if (allocator.transfer_footprint(largest)) plan.add(allocator, "staging", largest, vk::MemoryUsage::staging);
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

  void initialise(const std::optional<Checkpoint>& start, const std::string& start_path) {
    network.initialise(options.seed);
    Network::Layer& loss = network.layer("loss");
    if (!options.class_weights.empty()) {
      auto classes = static_cast<size_t>(loss.tensors[0]->count());
      if (options.class_weights.size() != classes)
        throw UsageError("--class-weights has " + std::to_string(options.class_weights.size()) +
                         " values; the data has " + std::to_string(classes) + " classes");
      loss.tensors[0]->upload(options.class_weights);
    }
    // The loss is the sum of per-sample terms; each micro-batch adds 1/K of its gradient
    // (replicated, loss_weight replaces this before every backward pass).
    loss.output_grad->upload(
        std::vector<float>(static_cast<size_t>(part.count), 1.0f / static_cast<float>(options.accumulate)));
    for (auto& [name, states] : optimizer_states)
      for (auto& state : states) state->upload(std::vector<float>(static_cast<size_t>(state->count()), 0.0f));
    uint32_t step[2] = {0, 0};
    extra["step"]->upload(step, sizeof step);
    if (loss_scale) loss_scale->upload({initial_loss_scale()});
    if (start) {
      load_tensors(start->params, checkpoint_tensors(), start_path, "params");
      if (!start->train.empty()) load_tensors(start->train, train_tensors(), start_path, "train");
    }
  }

  Network::Bound bound(int slot, int k) {
    Network::Bound inputs;
    for (auto& input : staged_inputs) inputs[input.name] = extra[input.name + suffix(slot, k)].get();
    return inputs;
  }

  std::map<std::string, const Tensor*> staged(int slot, int k) {
    auto inputs = bound(slot, k);
    return {inputs.begin(), inputs.end()};
  }

  void record_update(vk::Recorder& recorder) {
    auto& kernels = context.kernels();
    const Tensor& step = *extra["step"];
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

  // Elements of layer l's parameters.
  int64_t parameter_count(size_t l) const {
    int64_t count = 0;
    for (auto& spec : network.layers()[l].specs)
      if (spec.role == TensorRole::parameter) count += element_count(spec.shape);
    return count;
  }

  // Replicated, the last micro-batch's backward runs in up to kSegments programs of about equal
  // parameter bytes, last layers first, each ending with the copy of the gradients it finished
  // into its range of `gradients` (laid out last layer first), so that the host sums one
  // segment's gradients, and all-reduces them over MPI, while the device computes the next.
  struct Segment {
    size_t begin, end;     // layers [begin, end)
    size_t first, count;   // floats of `gradients`
  };
  static constexpr int kSegments = 4;

  std::vector<Segment> plan_segments() const {
    size_t layers = network.layers().size();
    int with_parameters = 0;
    for (size_t l = 0; l < layers; ++l) with_parameters += parameter_count(l) > 0 ? 1 : 0;
    // --sync-bn already waits for every replica at each batch norm: one segment.
    int wanted = synced() ? 1 : std::max(1, std::min(kSegments, with_parameters));
    auto target = static_cast<size_t>((gradient_count() + wanted - 1) / wanted);
    std::vector<Segment> planned;
    Segment current{0, layers, 0, 0};
    for (size_t l = layers; l-- > 0;) {
      current.count += static_cast<size_t>(parameter_count(l));
      if (l > 0 && current.count >= target && static_cast<int>(planned.size()) + 1 < wanted) {
        current.begin = l;
        planned.push_back(current);
        current = {0, l, current.first + current.count, 0};
      }
    }
    planned.push_back(current);
    return planned;
  }

  // Copies between the gradients of layers [begin, end) and their range of the host copy.
  void record_gradient_copies(vk::Recorder& recorder, bool to_host, const Segment& segment) {
    recorder.set_scope("gradient exchange");
    const vk::Buffer& host = extra["gradients"]->buffer();
    uint64_t offset = segment.first * sizeof(float);
    auto& layers = network.layers();
    for (size_t l = segment.end; l-- > segment.begin;)
      for (size_t i = 0; i < layers[l].specs.size(); ++i) {
        if (layers[l].specs[i].role != TensorRole::parameter) continue;
        const Tensor& grad = *layers[l].grads[i];
        if (grad.dtype() != DType::f32) throw std::logic_error("the gradient exchange sums float32 gradients");
        if (to_host)
          recorder.copy(grad.buffer(), 0, host, offset, grad.bytes());
        else
          recorder.copy(host, offset, grad.buffer(), 0, grad.bytes());
        offset += grad.bytes();
      }
  }

  void record() {
    auto& kernels = context.kernels();
    const Tensor& step = *extra["step"];
    if (replicated) segments = plan_segments();
    for (int slot = 0; slot < 2; ++slot) {
      for (int k = 0; k < options.accumulate; ++k) {
        bool last = k == options.accumulate - 1;
        recording = &train_programs[slot].emplace_back();
        recording_suffix = suffix(slot, k);
        recording->programs.push_back(std::make_unique<vk::Program>(context));
        vk::Recorder recorder(context, *recording->programs.back());
        // Dropout draws by the sample's place in the whole batch, whichever replica computes it.
        Network::Pass pass{true, options.seed, &step, static_cast<uint32_t>(k * batch + part.first),
                           synced() ? this : nullptr};
        auto inputs = bound(slot, k);
        network.record_forward(recorder, kernels, inputs, pass);
        record_metrics(recorder, slot, k);
        if (!replicated) {
          if (loss_scale) {
            recorder.set_scope("loss scale");
            loss_scale->record_loss_gradient(recorder, kernels, *network.layer("loss").output_grad,
                                             1.0f / static_cast<float>(options.accumulate));
          }
          network.record_backward(recorder, kernels, inputs, pass);
          if (last) record_update(recorder);
          recorder.finish();
          continue;
        }
        const Tensor& dloss = *network.layer("loss").output_grad;
        recorder.copy(extra["loss_weight" + suffix(slot, k)]->buffer(), 0, dloss.buffer(), 0, dloss.bytes());
        if (loss_scale) {
          recorder.set_scope("loss scale");
          loss_scale->record_loss_gradient(recorder, kernels, dloss, std::nullopt);
        }
        if (!last) {
          network.record_backward(recorder, kernels, inputs, pass);
          recorder.finish();
          continue;
        }
        for (size_t s = 0; s < segments.size(); ++s) {
          std::optional<vk::Recorder> next;
          if (s > 0) {
            backward_segments[slot].push_back(std::make_unique<vk::Program>(context));
            next.emplace(context, *backward_segments[slot].back());
          }
          vk::Recorder& into = s > 0 ? *next : recorder;
          network.record_backward(into, kernels, inputs, pass, segments[s].begin, segments[s].end);
          record_gradient_copies(into, true, segments[s]);
          into.finish();
        }
      }
      eval_programs[slot] = std::make_unique<vk::Program>(context);
      vk::Recorder recorder(context, *eval_programs[slot]);
      network.record_forward(recorder, kernels, bound(slot, 0), Network::Pass{false, options.seed, &step, 0});
      record_metrics(recorder, slot, 0);
      recorder.finish();
    }
    if (replicated) {
      update_program = std::make_unique<vk::Program>(context);
      vk::Recorder recorder(context, *update_program);
      for (auto& segment : segments) record_gradient_copies(recorder, false, segment);
      record_update(recorder);
      recorder.finish();
    }
  }

  // The program that ends segment s of the last micro-batch's backward in `slot`.
  vk::Program& segment_program(int slot, size_t s) {
    return s == 0 ? *train_programs[slot].back().programs.back() : *backward_segments[slot][s - 1];
  }

  int64_t batch_total() const override { return batch; }

  // Ends the program being recorded with a copy of `values` for the host, and begins the next
  // with the combined values copied back.
  void exchange(vk::Recorder& recorder, const Tensor& values, Combine combine, int64_t count) override {
    const Tensor& host = *extra.at(values.name() + recording_suffix);
    recorder.copy(values.buffer(), 0, host.buffer(), 0, values.bytes());
    recording->exchanges.push_back({&host, combine, count});
    recording->programs.push_back(std::make_unique<vk::Program>(context));
    recorder.continue_in(*recording->programs.back());
    recorder.copy(host.buffer(), 0, values.buffer(), 0, values.bytes());
  }

  void record_metrics(vk::Recorder& recorder, int slot, int k) {
    struct Push {
      uint32_t classes;
    } push{static_cast<uint32_t>(logits.output_shape[1])};
    recorder.set_scope("metrics");
    auto& kernels = context.kernels();
    recorder.dispatch(kernel_for(kernels, reduction_kernel(kernels, "metrics_accumulate", "metrics_accumulate_subgroup"),
                                 *logits.output),
                      {reads(*logits.output), vk::reads(extra["labels" + suffix(slot, k)]->buffer()),
                       vk::reads(extra["valid" + suffix(slot, k)]->buffer()), vk::updates(extra["metrics"]->buffer())},
                      push, 1);
    recorder.set_scope("");
  }

  // NaN in the last parameter (`name` empty) reaches the logits unchanged (a max or a ReLU
  // earlier on would turn it back into a number), so the loss is NaN from the first step;
  // otherwise NaN in the named tensor.
  void inject_nan(const std::string& name) {
    auto named = network.named_tensors();
    auto target = name.empty() ? std::prev(named.end())
                               : std::find_if(named.begin(), named.end(), [&](auto& n) { return n.name == name; });
    if (target == named.end()) throw UsageError("TESSERA_FAULT=nan:" + name + ": the model has no such tensor");
    std::vector<float> values(static_cast<size_t>(target->tensor->count()), std::nanf(""));
    target->tensor->upload(values);
  }

  void wait_all() {
    for (auto& micro_batches : train_programs)
      for (auto& micro_batch : micro_batches)
        for (auto& p : micro_batch.programs) p->wait();
    for (auto& programs : backward_segments)
      for (auto& p : programs) p->wait();
    for (auto& p : eval_programs)
      if (p) p->wait();
    if (update_program) update_program->wait();
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

  // val_auc of a two-class model: the slot's logits and labels, read back before it is refilled.
  void score(int slot, BinaryScores& scores) {
    eval_programs[slot]->wait();
    const Tensor& labels = *extra.at("labels" + suffix(slot, 0));
    std::vector<uint32_t> label_values(static_cast<size_t>(labels.count()));
    labels.download(label_values.data(), labels.bytes());
    uint32_t valid = 0;
    extra.at("valid" + suffix(slot, 0))->download(&valid, sizeof valid);
    scores.add(logits.output->download(), label_values, valid);
  }

  std::map<std::string, Tensor*> checkpoint_tensors() {
    std::map<std::string, Tensor*> tensors;
    for (auto& named : network.named_tensors()) tensors[named.name] = named.tensor;
    return tensors;
  }

  std::map<std::string, Tensor*> train_tensors() {
    std::map<std::string, Tensor*> tensors{{"step", extra["step"].get()}};
    for (auto& [name, states] : optimizer_states)
      for (auto& state : states) tensors["optimizer/" + state->name()] = state.get();
    if (loss_scale) tensors["loss_scale"] = extra["loss_scale"].get();
    return tensors;
  }

  vk::Context& context;
  const TrainOptions& options;
  int64_t batch;   // samples of a micro-batch, over all replicas
  BatchPart part;  // this replica's of every training micro-batch
  bool replicated;
  std::vector<GraphInput> staged_inputs;
  Network network;
  Network::Layer& logits;
  std::unique_ptr<Optimizer> optimizer;
  std::map<std::string, std::unique_ptr<Tensor>> extra;
  std::optional<LossScale> loss_scale;  // mixed precision
  std::map<std::string, std::vector<std::unique_ptr<Tensor>>> optimizer_states;
  // A micro-batch's commands: one program, or with --sync-bn one more after each exchange.
  struct Exchange {
    const Tensor* host;  // this replica's values, combined in place over every replica
    Combine combine;
    int64_t count;       // elements per channel on this replica
  };
  struct MicroBatch {
    std::vector<std::unique_ptr<vk::Program>> programs;
    std::vector<Exchange> exchanges;  // exchanges[i] between programs[i] and programs[i + 1]
  };
  std::array<std::vector<MicroBatch>, 2> train_programs;  // [slot][k]
  MicroBatch* recording = nullptr;                        // while record() runs
  std::string recording_suffix;
  std::array<std::unique_ptr<vk::Program>, 2> eval_programs;
  std::vector<Segment> segments;  // replicated: of the last micro-batch's backward
  std::array<std::vector<std::unique_ptr<vk::Program>>, 2> backward_segments;  // segments after the first
  std::unique_ptr<vk::Program> update_program;
};

}  // namespace

struct TrainingLoop::State {
  State(const std::vector<vk::Context*>& devices, const TrainOptions& run_options, TrainingJob run_job)
      : options(run_options), job(std::move(run_job)), processes(Processes::world()) {
    int local = static_cast<int>(devices.size());
    int replicas_total = local * processes.size();
    int64_t batch = 0;
    for (auto& input : job.staged)
      if (input.name == "labels") batch = input.shape[0];
    if (batch == 0) throw std::logic_error("a training job stages no labels");
    bool replicated = replicas_total > 1;
    if (replicated && batch < replicas_total)
      throw UsageError("--devices: " + std::to_string(replicas_total) + " replicas (" + std::to_string(local) +
                       " devices x " + std::to_string(processes.size()) +
                       " processes) need at least one sample each, but a micro-batch has " + std::to_string(batch) +
                       (batch == 1 ? " (a slide-level head trains on one bag at a time)" : " (--batch)"));
    for (auto& input : job.staged)
      if (replicated && input.name != "valid" && (input.shape.empty() || input.shape[0] != batch))
        throw std::logic_error("data-parallel training splits staged inputs by their first dimension; " + input.name +
                               " is " + to_string(input.shape));
    for (int d = 0; d < local; ++d) {
      int replica = processes.rank() * local + d;
      BatchPart part = replicated ? batch_part(batch, replica, replicas_total) : BatchPart{0, batch};
      replicas.push_back(
          std::make_unique<Replica>(*devices[static_cast<size_t>(d)], options, job, batch, part, replicated));
    }
    replicas_in_job = replicas_total;
    if (options.sync_batch_norm && !replicated)
      throw UsageError("--sync-bn combines batch norm statistics over replicas, and this run has one: add --devices, "
                       "or run under mpirun/srun");
    if (options.sync_batch_norm && !first().synced_layers())
      throw UsageError("--sync-bn: the model has no batch norm");
  }

  bool replicated() const { return replicas_in_job > 1; }
  Replica& first() { return *replicas.front(); }
  int64_t batch() const { return replicas.front()->batch; }

  // Replicated, the Feed writes the whole micro-batch here, and each replica takes its part.
  std::vector<LoopTensor> whole_batch_tensors() const {
    std::vector<LoopTensor> tensors;
    if (replicated())
      for (auto& input : job.staged) tensors.push_back({input.name, input.shape, input.dtype, vk::MemoryUsage::staging, "staging"});
    return tensors;
  }

  std::vector<MemoryPlan> plans() const {
    std::vector<MemoryPlan> plans;
    for (auto& replica : replicas) plans.push_back(replica->plan());
    auto& allocator = replicas.front()->context.allocator();
    for (auto& t : whole_batch_tensors())
      plans.front().bytes[t.category] += allocator.footprint(static_cast<uint64_t>(element_count(t.shape)) * element_size(t.dtype));
    return plans;
  }

  void allocate() {
    for (auto& replica : replicas) replica->allocate();
    for (auto& t : whole_batch_tensors())
      whole[t.name] = std::make_unique<Tensor>(first().context, t.name, t.shape, t.dtype, t.usage);
  }

  std::map<std::string, const Tensor*> feed_target(int slot, int k) {
    if (!replicated()) return first().staged(slot, k);
    std::map<std::string, const Tensor*> target;
    for (auto& [name, tensor] : whole) target[name] = tensor.get();
    return target;
  }

  // Copies each replica's part of the whole micro-batch into its slot: in training the fixed
  // part its network was built for, with the weight of its samples' losses; in evaluation the
  // valid samples split again, so a short last batch spreads over the replicas too.
  void distribute(int slot, int k, bool training) {
    if (!replicated()) return;
    uint32_t valid = 0;
    std::memcpy(&valid, whole.at("valid")->buffer().mapped(), 4);
    const auto* labels = static_cast<const uint32_t*>(whole.at("labels")->buffer().mapped());
    std::vector<double> weight(static_cast<size_t>(batch()));
    int64_t classes = first().logits.output_shape[1];
    for (size_t n = 0; n < weight.size(); ++n)
      weight[n] = labels[n] >= classes ? std::nan("")
                  : options.class_weights.empty() ? 1.0
                                                  : options.class_weights[labels[n]];
    double batch_weight = 0;
    for (double w : weight) batch_weight += w;
    for (size_t r = 0; r < replicas.size(); ++r) {
      Replica& replica = *replicas[r];
      BatchPart part = training ? replica.part
                                : batch_part(valid, processes.rank() * static_cast<int>(replicas.size()) + static_cast<int>(r),
                                             replicas_in_job);
      for (auto& input : job.staged) {
        if (input.name == "valid") continue;
        const Tensor& from = *whole.at(input.name);
        const Tensor& to = *replica.extra.at(input.name + suffix(slot, k));
        uint64_t per_sample = from.bytes() / static_cast<uint64_t>(batch());
        auto* destination = static_cast<uint8_t*>(to.buffer().mapped());
        std::memcpy(destination, static_cast<const uint8_t*>(from.buffer().mapped()) + part.first * per_sample,
                    part.count * per_sample);
        std::memset(destination + part.count * per_sample, 0, to.bytes() - part.count * per_sample);
      }
      auto replica_valid = static_cast<uint32_t>(std::clamp<int64_t>(valid - part.first, 0, part.count));
      std::memcpy(replica.extra.at("valid" + suffix(slot, k))->buffer().mapped(), &replica_valid, 4);
      if (!training) continue;
      // The loss is a weighted mean over its samples: scaled by their share of the batch's weight,
      // the replicas' gradients sum to the one of the whole batch.
      double part_weight = 0;
      for (int64_t n = part.first; n < part.first + part.count; ++n) part_weight += weight[static_cast<size_t>(n)];
      auto scale = static_cast<float>(part_weight / batch_weight / options.accumulate);
      auto* loss_weight = static_cast<float*>(replica.extra.at("loss_weight" + suffix(slot, k))->buffer().mapped());
      std::fill(loss_weight, loss_weight + part.count, scale);
    }
  }

  // Submits micro-batch k of `slot` on every replica; with --sync-bn, part by part, combining
  // the replicas' values at each exchange before the next part starts.
  void run_micro_batch(int slot, size_t k) {
    size_t parts = first().train_programs[slot][k].programs.size();
    for (size_t p = 0; p < parts; ++p) {
      for (auto& replica : replicas) replica->train_programs[slot][k].programs[p]->submit();
      if (p + 1 < parts) combine(slot, k, p);
    }
    if (k + 1 == static_cast<size_t>(options.accumulate))
      for (auto& replica : replicas)
        for (auto& segment : replica->backward_segments[slot]) segment->submit();
  }

  // Exchange p of micro-batch k over every replica of the job, in double on the host: batch
  // norm moments (mean, M2 of n elements) merged by Chan et al.'s rule into the mean and
  // biased variance of all elements; sums added.
  void combine(int slot, size_t k, size_t p) {
    std::vector<float*> values;
    std::vector<double> counts;
    for (auto& replica : replicas) {
      auto& micro_batch = replica->train_programs[slot][k];
      micro_batch.programs[p]->wait();
      values.push_back(static_cast<float*>(micro_batch.exchanges[p].host->buffer().mapped()));
      counts.push_back(static_cast<double>(micro_batch.exchanges[p].count));
    }
    const auto& exchange = first().train_programs[slot][k].exchanges[p];
    auto size = static_cast<size_t>(exchange.host->count());
    std::vector<double> combined(size, 0.0);
    if (exchange.combine == ReplicaSync::Combine::sum) {
      for (float* v : values)
        for (size_t i = 0; i < size; ++i) combined[i] += v[i];
      processes.sum(combined);
    } else {
      size_t channels = size / 2;
      std::vector<double> weighted(channels + 1, 0.0);  // sum of n * mean per channel, then of n
      for (size_t r = 0; r < values.size(); ++r) {
        for (size_t c = 0; c < channels; ++c) weighted[c] += counts[r] * values[r][c];
        weighted[channels] += counts[r];
      }
      processes.sum(weighted);
      double total = weighted[channels];
      for (size_t c = 0; c < channels; ++c) combined[c] = weighted[c] / total;
      std::vector<double> m2(channels, 0.0);
      for (size_t r = 0; r < values.size(); ++r)
        for (size_t c = 0; c < channels; ++c) {
          double d = values[r][c] - combined[c];
          m2[c] += values[r][channels + c] + counts[r] * d * d;
        }
      processes.sum(m2);
      for (size_t c = 0; c < channels; ++c) combined[channels + c] = m2[c] / total;
    }
    for (float* v : values)
      for (size_t i = 0; i < size; ++i) v[i] = static_cast<float>(combined[i]);
  }

  // Replicated: sums the gradients of the step in `slot` segment by segment, as each finishes on
  // every replica (while the later segments run), then starts every replica's update.
  void exchange(int slot) {
    auto& segments = first().segments;
    for (size_t s = 0; s < segments.size(); ++s) {
      std::vector<std::span<float>> copies;
      for (auto& replica : replicas) {
        replica->segment_program(slot, s).wait();
        auto* gradients = static_cast<float*>(replica->extra.at("gradients")->buffer().mapped());
        copies.push_back({gradients + segments[s].first, segments[s].count});
      }
      auto before = Clock::now();
      sum_gradients(copies, processes);
      exchange_seconds += std::chrono::duration<double>(Clock::now() - before).count();
      exchange_bytes += segments[s].count * sizeof(float);
    }
    for (auto& replica : replicas) replica->update_program->submit();
  }

  void train(Feed& train_feed, Feed& validation_feed, const TrainReporting& reporting) {
    int first_epoch = 0;
    if (job.start && job.start->progress.is_object()) first_epoch = job.start->progress.value("epoch", 0);
    size_t steps = train_feed.batches_per_epoch() / static_cast<size_t>(options.accumulate);
    uint64_t total_steps = steps * static_cast<uint64_t>(options.epochs - first_epoch);
    check_processes_agree({static_cast<double>(steps), static_cast<double>(validation_feed.batches_per_epoch()),
                           static_cast<double>(first_epoch), static_cast<double>(first().gradient_count())});
    // Every process loads whole batches (the loss weights need every label) but decodes only the
    // training samples of its own replicas, which are consecutive.
    if (processes.size() > 1)
      train_feed.compute_only(first().part.first, replicas.back()->part.first + replicas.back()->part.count -
                                                      first().part.first);
    // Every process reads the metrics at the same steps (a collective); rank 0 reports them.
    bool lead = processes.rank() == 0;
    std::unique_ptr<Progress> progress;
    if (reporting.progress && lead) progress = std::make_unique<Progress>("train", total_steps);
    nlohmann::json last;
    double wait_seconds = 0, run_seconds = 0;
    uint64_t done = 0;
    for (int epoch = first_epoch; epoch < options.epochs; ++epoch) {
      auto epoch_start = Clock::now();
      train_feed.start_epoch(static_cast<uint32_t>(epoch));
      reset_metrics();
      exchange_seconds = 0;
      exchange_bytes = 0;
      for (size_t step = 0; step < steps; ++step) {
        int slot = static_cast<int>(step % 2);
        for (int k = 0; k < options.accumulate; ++k) {
          for (auto& replica : replicas) replica->train_programs[slot][static_cast<size_t>(k)].programs.back()->wait();
          auto before = Clock::now();
          if (!train_feed.next(feed_target(slot, k))) throw std::logic_error("the feed ended before its batches_per_epoch");
          wait_seconds += std::chrono::duration<double>(Clock::now() - before).count();
          distribute(slot, k, true);
          run_micro_batch(slot, static_cast<size_t>(k));
        }
        if (replicated()) exchange(slot);
        ++done;
        if (reporting.progress && (step + 1) % 20 == 0) {
          auto m = read_metrics();
          check_finite(m[0], epoch, step);
          if (progress) progress->update(done, {{"epoch", epoch + 1}, {"loss", m[0] / std::max(1.0, m[2])}});
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
              {"train_samples", std::llround(train_metrics[2])},
              {"val_samples", std::llround(val_metrics[2])},
              {"images_per_second", train_metrics[2] / train_seconds},
              {"data_wait_fraction", run_seconds > 0 ? wait_seconds / run_seconds : 0.0},
              {"peak_device_bytes", peak_device_bytes()}};
      if (auto auc = val_scores.auc()) last["val_auc"] = *auc;
      if (first().loss_scale) {
        auto scaling = first().loss_scale->download();
        last["loss_scale"] = scaling.scale;
        last["skipped_steps"] = scaling.skipped_steps;
      }
      auto params = download_tensors(first().checkpoint_tensors());
      if (replicated()) {
        last["replicas"] = replicas_in_job;
        last["replica_weight_difference"] = replica_weight_difference(params);
        // The host's gradient sum (over this process's replicas, then MPI), per replica's bytes.
        last["allreduce_bytes_per_second"] = exchange_seconds > 0 ? exchange_bytes / exchange_seconds : 0.0;
      }
      last.update(job.report);
      if (progress) progress->event(last);
      if (reporting.protocol && lead) {
        double value = val_metrics[2] > 0 ? val_metrics[0] / val_samples : train_metrics[0] / samples;
        reporting.protocol({{"type", "intermediate"}, {"step", epoch + 1}, {"value", value}, {"metrics", last}});
      }
      check_finite_state(params, download_tensors(first().train_tensors()), epoch + 1);
      if (!options.checkpoint.empty() && lead) save(epoch + 1, last);
      sigkill_fault(epoch + 1, processes.rank());
    }
    if (progress) progress->finish();
    uint64_t peak = peak_device_bytes();  // a collective: every process, protocol or not
    if (reporting.protocol && lead && last.is_object()) {
      double value = last["val_loss"].is_number() ? last["val_loss"].get<double>() : last.value("train_loss", 0.0);
      reporting.protocol({{"type", "final"},
                          {"value", value},
                          {"metrics", last},
                          {"peak_device_bytes", peak},
                          {"device", first().context.info().name}});
    }
  }

  // Processes that disagree on the number of collectives to come would wait for each other
  // forever: each one's steps, validation batches, first epoch and gradient size must match.
  void check_processes_agree(std::vector<double> counts) {
    std::vector<double> largest = counts, negated = counts;
    for (auto& value : negated) value = -value;
    processes.max(largest);
    processes.max(negated);
    for (size_t i = 0; i < counts.size(); ++i)
      if (largest[i] != -negated[i])
        throw BadInput("the processes of the MPI job see different runs (steps per epoch, validation batches, first "
                       "epoch, gradient size: this one has " + std::to_string(static_cast<int64_t>(counts[0])) + ", " +
                       std::to_string(static_cast<int64_t>(counts[1])) + ", " + std::to_string(static_cast<int64_t>(counts[2])) +
                       ", " + std::to_string(static_cast<int64_t>(counts[3])) +
                       "): every process must read the same --data, model and checkpoint");
  }

  // The most any one device of the job has held.
  uint64_t peak_device_bytes() {
    double peak = 0;
    for (auto& replica : replicas) peak = std::max(peak, static_cast<double>(replica->context.allocator().stats().peak_bytes));
    processes.max(std::span<double>(&peak, 1));
    return static_cast<uint64_t>(peak);
  }

  // The largest difference between a parameter of any replica and rank 0's first replica's:
  // zero while every replica runs the same update on the same summed gradient.
  double replica_weight_difference(const std::map<std::string, HostArray>& params) {
    std::vector<float> reference;
    for (auto& [name, array] : params) reference.insert(reference.end(), array.values.begin(), array.values.end());
    std::vector<float> own = reference;
    processes.broadcast(reference.data(), reference.size() * sizeof(float));
    double difference = 0;
    for (auto& replica : replicas) {
      auto mine = replica.get() == replicas.front().get() ? std::map<std::string, HostArray>{}
                                                            : download_tensors(replica->checkpoint_tensors());
      size_t i = 0;
      for (auto& [name, array] : params)
        for (size_t j = 0; j < array.values.size(); ++j, ++i) {
          float value = mine.empty() ? own[i] : mine.at(name).values[j];
          difference = std::max(difference, static_cast<double>(std::fabs(value - reference[i])));
        }
    }
    processes.max(std::span<double>(&difference, 1));
    return difference;
  }

  void wait_all() {
    for (auto& replica : replicas) replica->wait_all();
  }

  void reset_metrics() {
    for (auto& replica : replicas) replica->reset_metrics();
  }

  // The metrics summed over every replica of the job.
  std::array<double, 3> read_metrics() {
    std::array<double, 3> total{0, 0, 0};
    for (auto& replica : replicas) {
      auto m = replica->read_metrics();
      for (size_t i = 0; i < 3; ++i) total[i] += m[i];
    }
    processes.sum(std::span<double>(total));
    return total;
  }

  void check_finite(double loss_sum, int epoch, size_t step) {
    if (!std::isfinite(loss_sum))
      throw Diverged("training diverged: the loss is not finite in epoch " + std::to_string(epoch + 1) + " by step " +
                     std::to_string(step) + " (try a lower --lr)");
  }

  // Replicated, every replica evaluates with rank 0's first replica's running statistics (as
  // PyTorch DDP broadcasts rank 0's buffers), which is also what checkpoints keep.
  void broadcast_state() {
    std::vector<Network::Named> reference;
    for (auto& named : first().network.named_tensors())
      if (!named.grad) reference.push_back(named);
    for (auto& named : reference) {
      std::vector<float> values = named.tensor->download();
      processes.broadcast(values.data(), values.size() * sizeof(float));
      for (auto& replica : replicas)
        if (replica.get() != replicas.front().get() || processes.rank() != 0)
          replica->checkpoint_tensors().at(named.name)->upload(values);
    }
  }

  std::array<double, 3> evaluate(Feed& feed, int epoch) {
    if (replicated()) {
      wait_all();
      broadcast_state();
    }
    reset_metrics();
    val_scores.clear();
    feed.start_epoch(static_cast<uint32_t>(epoch));
    bool binary = first().logits.output_shape[1] == 2;
    for (size_t b = 0;; ++b) {
      int slot = static_cast<int>(b % 2);
      for (auto& replica : replicas) replica->eval_programs[slot]->wait();
      if (!feed.next(feed_target(slot, 0))) break;
      distribute(slot, 0, false);
      for (auto& replica : replicas) replica->eval_programs[slot]->submit();
      if (binary)
        for (auto& replica : replicas) replica->score(slot, val_scores);
    }
    if (binary && processes.size() > 1) val_scores = gather_scores(val_scores);
    return read_metrics();
  }

  // Every process's validation scores, on every process.
  BinaryScores gather_scores(const BinaryScores& mine) {
    std::vector<double> packed;
    for (auto& [score, label] : mine.scored()) {
      packed.push_back(score);
      packed.push_back(label);
    }
    auto bytes = processes.gather({reinterpret_cast<const uint8_t*>(packed.data()), packed.size() * sizeof(double)});
    std::vector<double> all(bytes.size() / sizeof(double));
    std::memcpy(all.data(), bytes.data(), bytes.size());
    BinaryScores scores;
    for (size_t i = 0; i + 1 < all.size(); i += 2) scores.add(all[i], static_cast<uint32_t>(all[i + 1]));
    return scores;
  }

  void save(int epochs_done, const nlohmann::json& metrics) {
    wait_all();
    Checkpoint checkpoint;
    checkpoint.model = job.model;
    checkpoint.params = download_tensors(first().checkpoint_tensors());
    checkpoint.train = download_tensors(first().train_tensors());
    checkpoint.progress = run_settings(options);
    checkpoint.progress.update({{"epoch", epochs_done}, {"metrics", metrics}});
    write_checkpoint(options.checkpoint, checkpoint);
  }

  void run(Feed& train_feed, Feed& validation_feed, const TrainReporting& reporting) {
    // Every device's plan is checked before any device allocates.
    auto device_plans = plans();
    for (size_t r = 0; r < replicas.size(); ++r) check_plan_fits(replicas[r]->context, device_plans[r], job.advice);
    for (auto& replica : replicas) inject_fault_before_training(replica->context);
    allocate();
    for (auto& replica : replicas) {
      replica->initialise(job.start, job.start_path);
      if (auto name = nan_fault()) replica->inject_nan(*name);
      replica->record();
    }
    train(train_feed, validation_feed, reporting);
  }

  const TrainOptions& options;
  TrainingJob job;
  Processes& processes;
  int replicas_in_job = 1;
  std::vector<std::unique_ptr<Replica>> replicas;  // this process's, in device order
  std::map<std::string, std::unique_ptr<Tensor>> whole;
  BinaryScores val_scores;
  double exchange_seconds = 0;  // host time summing gradients (and all-reducing them over MPI)
  uint64_t exchange_bytes = 0;  // gradient bytes summed, per replica
};

TrainingLoop::TrainingLoop(vk::Context& context, const TrainOptions& options, TrainingJob job)
    : TrainingLoop(std::vector<vk::Context*>{&context}, options, std::move(job)) {}

TrainingLoop::TrainingLoop(const std::vector<vk::Context*>& devices, const TrainOptions& options, TrainingJob job)
    : state_(std::make_unique<State>(devices, options, std::move(job))) {}

int64_t TrainingLoop::classes() const { return state_->first().logits.output_shape[1]; }

TrainingLoop::~TrainingLoop() {
  if (state_) state_->wait_all();
}

std::vector<MemoryPlan> TrainingLoop::plans() const { return state_->plans(); }

void TrainingLoop::run(Feed& train, Feed& validation, const TrainReporting& reporting) {
  state_->run(train, validation, reporting);
}

void check_plan_fits(vk::Context& context, const MemoryPlan& plan, const std::string& advice) {
  const vk::Allocator& allocator = context.allocator();
  uint64_t budget = allocator.stats().budget_bytes;
  uint64_t in_use = allocator.stats().live_bytes;
  // The blocks the allocator will hold bound the run, not only the buffers' bytes.
  if (uint64_t device_bytes = plan.device_bytes(allocator); device_bytes > budget)
    throw OutOfDeviceMemory("the run needs " + format_bytes(plan.total()) + " of device memory, " +
                            format_bytes(device_bytes) + " in the allocator's blocks" +
                            (in_use ? " with " + format_bytes(in_use) + " already in use" : std::string()) +
                            (context.info().name.empty() ? std::string() : " on " + context.info().name) +
                            "; the budget is " + format_bytes(budget) + " (" + advice + ")");
}

}  // namespace tessera
