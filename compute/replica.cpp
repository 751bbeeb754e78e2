#include "compute/replica.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace tessera {

nlohmann::json loss_layers(const nlohmann::json& graph, const std::vector<LossTerm>& extra) {
  std::string logits = graph["layers"].back()["name"];
  nlohmann::json layers = nlohmann::json::array(
      {{{"name", "loss"}, {"type", "softmax_cross_entropy"}, {"inputs", {logits, "labels"}}}});
  for (auto& term : extra)
    if (!term.computes_loss)
      layers.push_back(
          {{"name", extra_loss_name(term)}, {"type", "softmax_cross_entropy"}, {"inputs", {term.layer, "labels"}}});
  return layers;
}

size_t staged_input_index(const std::vector<GraphInput>& inputs, const std::string& name) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].name == name) return i;
  throw std::logic_error("a training job stages no " + name);
}

namespace {

// The job's staged inputs for one replica of several, which takes `count` samples of every
// micro-batch: the inputs, all with a leading batch dimension, are cut to it ("valid" stays [1]).
std::vector<GraphInput> part_inputs(std::vector<GraphInput> staged, bool replicated, int64_t count) {
  if (replicated)
    for (auto& input : staged)
      if (input.name != "valid") input.shape[0] = count;
  return staged;
}

std::string suffix(int slot, int k) { return "." + std::to_string(slot) + "." + std::to_string(k); }

uint64_t bytes_of(const Shape& shape, DType dtype) {
  return static_cast<uint64_t>(element_count(shape)) * element_size(dtype);
}

}  // namespace

Replica::Replica(vk::Context& device, const LoopSettings& settings, const TrainingJob& job, int64_t batch,
                 BatchPart part, bool replicated)
    : context_(device),
      settings_(settings),
      batch_(batch),
      part_(part),
      replicated_(replicated),
      staged_inputs_(part_inputs(job.staged, replicated, part.count)),
      labels_input_(staged_input_index(staged_inputs_, "labels")),
      valid_input_(staged_input_index(staged_inputs_, "valid")),
      network_(job.graph, staged_inputs_, true, job.prologue, loss_layers(job.graph, job.extra_losses)),
      logits_(network_.layer(job.graph["layers"].back()["name"].get<std::string>())),
      optimizer_(Optimizer::make(settings.optimizer)) {
  network_.set_activation_dtype(settings.fp16 ? DType::f16 : DType::f32);
  losses_.push_back({&network_.layer("loss"), job.logits_loss_weight});
  for (auto& term : job.extra_losses) losses_.push_back({&network_.layer(extra_loss_name(term)), term.weight});
  // A replica's loss weights (the samples' shares of a data-parallel batch) replace the loss
  // gradient with the logits' term alone.
  if (replicated_ && (losses_.size() > 1 || job.logits_loss_weight != 1))
    throw std::logic_error("a loss of weighted terms trains on one replica");
}

std::vector<Replica::Planned> Replica::planned() const {
  using Kind = Planned::Kind;
  std::vector<Planned> list;
  auto staging = vk::MemoryUsage::staging;
  auto& layers = network_.layers();
  // Slots of staged inputs (one filled while the other's step runs) of K micro-batches.
  for (int slot = 0; slot < slots_; ++slot)
    for (int k = 0; k < settings_.accumulate; ++k) {
      for (size_t i = 0; i < staged_inputs_.size(); ++i) {
        const GraphInput& input = staged_inputs_[i];
        list.push_back({Kind::input, input.name + suffix(slot, k), input.shape, input.dtype, staging, "staging", slot, k, i,
                        0, network_.input_windowed(input.name)});
      }
      // Replicated: the weight of each sample's loss, so that the replicas' gradients sum to the batch's.
      if (replicated_)
        list.push_back({Kind::loss_weight, "loss_weight" + suffix(slot, k), {part_.count}, DType::f32, staging,
                        "staging", slot, k});
      // --sync-bn: the host's copy of what each batch norm exchanges.
      if (synced())
        for (size_t l = 0; l < layers.size(); ++l)
          for (size_t s = 0; s < layers[l].specs.size(); ++s)
            if (const TensorSpec& spec = layers[l].specs[s]; spec.name == kExchanged)
              list.push_back({Kind::exchanged, layers[l].name + "." + spec.name + suffix(slot, k), spec.shape, spec.dtype,
                              staging, "gradient exchange", slot, k, l, s});
    }
  list.push_back({Kind::metrics, "metrics", {4}, DType::f32, staging, "staging"});
  list.push_back({Kind::step, "step", {2}, DType::u32, vk::MemoryUsage::device, "optimizer state"});
  if (settings_.fp16)
    list.push_back({Kind::loss_scale, "loss_scale", LossScale::shape(), DType::f32, vk::MemoryUsage::device,
                    "optimizer state"});
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t s = 0; s < layers[l].specs.size(); ++s) {
      const TensorSpec& spec = layers[l].specs[s];
      if (spec.role != TensorRole::parameter) continue;
      if (replicated_)
        list.push_back({Kind::gradients, "gradients/" + tensor_name(layers[l].name, spec), spec.shape, DType::f32, staging,
                        "gradient exchange", 0, 0, l, s});
      for (auto& state : optimizer_->state(spec))
        list.push_back({Kind::optimizer_state, tensor_name(layers[l].name, spec) + "." + state.name, state.shape,
                        state.dtype, vk::MemoryUsage::device, "optimizer state", 0, 0, l, s});
    }
  return list;
}

MemoryPlan Replica::plan() const {
  auto& allocator = context_.allocator();
  // In the order allocate() takes them, so that the plan places them as the allocator will.
  MemoryPlan plan = network_.plan(allocator);
  plan.staging_slots = slots_;
  for (auto& t : planned()) plan.add(allocator, t.category, bytes_of(t.shape, t.dtype), t.usage, t.name, t.windowed);
  // Uploads and checkpoint downloads stage one tensor at a time; the largest is a parameter or state.
  uint64_t largest = 0;
  for (auto& layer : network_.layers())
    for (auto& spec : layer.specs)
      if (in_checkpoint(spec.role)) largest = std::max(largest, bytes_of(spec.shape, spec.dtype));
  if (allocator.transfer_footprint(largest)) plan.add(allocator, "staging", largest, vk::MemoryUsage::staging);
  return plan;
}

void Replica::allocate() {
  using Kind = Planned::Kind;
  network_.allocate(context_);
  for (auto& slot : staging_) slot.resize(static_cast<size_t>(settings_.accumulate));
  for (auto& t : planned()) {
    auto tensor = std::make_unique<Tensor>(context_, t.name, t.shape, t.dtype, t.usage, t.windowed);
    StagedBatch& batch = staging_[t.slot][static_cast<size_t>(t.k)];
    switch (t.kind) {
      case Kind::input:
        batch.inputs.resize(staged_inputs_.size());
        batch.inputs[t.index] = std::move(tensor);
        break;
      case Kind::loss_weight: batch.loss_weight = std::move(tensor); break;
      case Kind::exchanged: batch.exchanged[network_.layers()[t.index].tensors[t.spec].get()] = std::move(tensor); break;
      case Kind::metrics: metrics_ = std::move(tensor); break;
      case Kind::step: step_ = std::move(tensor); break;
      case Kind::loss_scale: loss_scale_tensor_ = std::move(tensor); break;
      case Kind::gradients: host_gradients_[network_.layers()[t.index].grads[t.spec].get()] = std::move(tensor); break;
      case Kind::optimizer_state: {
        const Network::Layer& layer = network_.layers()[t.index];
        // Keyed as named_tensors() names the parameter (a model-level one, TransMIL's cls_token, unprefixed).
        optimizer_states_[tensor_name(layer.name, layer.specs[t.spec])].push_back(std::move(tensor));
        break;
      }
    }
  }
  if (loss_scale_tensor_) loss_scale_.emplace(*loss_scale_tensor_);
}

void Replica::initialise(const std::optional<Checkpoint>& start, const std::string& start_path,
                         std::optional<float> loss_scale) {
  network_.initialise(settings_.seed);
  for (auto& [loss, weight] : losses_) {
    // --class-weights weigh the softmax cross-entropy terms (a layer that computes its own loss
    // has no class weights: CLAM's instance loss is an unweighted CrossEntropyLoss).
    if (!settings_.class_weights.empty() && loss->op->type() == "softmax_cross_entropy") {
      auto classes = static_cast<size_t>(loss->tensors[0]->count());
      if (settings_.class_weights.size() != classes)
        throw UsageError("--class-weights has " + std::to_string(settings_.class_weights.size()) +
                         " values; the data has " + std::to_string(classes) + " classes");
      loss->tensors[0]->upload(settings_.class_weights);
    }
    // The loss is the sum of per-sample terms; each micro-batch adds 1/K of its gradient, each
    // term its weight (replicated, loss_weight replaces this before every backward pass).
    loss->output_grad->upload(
        std::vector<float>(static_cast<size_t>(part_.count), weight / static_cast<float>(settings_.accumulate)));
  }
  for (auto& [name, states] : optimizer_states_)
    for (auto& state : states) state->upload(std::vector<float>(static_cast<size_t>(state->count()), 0.0f));
  uint32_t step[2] = {0, 0};
  step_->upload(step, sizeof step);
  if (loss_scale_) loss_scale_->upload({loss_scale.value_or(LossScaleState{}.scale)});
  if (start) {
    load_tensors(start->params, checkpoint_tensors(), start_path, "params");
    if (!start->train.empty()) load_tensors(start->train, train_tensors(), start_path, "train");
  }
}

// NaN in the last parameter (`name` empty) reaches the logits unchanged (a max or a ReLU
// earlier on would turn it back into a number), so the loss is NaN from the first step;
// otherwise NaN in the named tensor.
void Replica::inject_nan(const std::string& name) {
  auto named = network_.named_tensors();
  auto target = name.empty() ? std::prev(named.end())
                             : std::find_if(named.begin(), named.end(), [&](auto& n) { return n.name == name; });
  if (target == named.end()) throw UsageError("TESSERA_FAULT=nan:" + name + ": the model has no such tensor");
  std::vector<float> values(static_cast<size_t>(target->tensor->count()), std::nanf(""));
  target->tensor->upload(values);
}

int Replica::synced_layers() const {
  int count = 0;
  for (auto& layer : network_.layers())
    for (auto& spec : layer.specs) count += spec.name == kExchanged ? 1 : 0;
  return count;
}

int64_t Replica::gradient_count() const {
  int64_t count = 0;
  for (size_t l = 0; l < network_.layers().size(); ++l) count += parameter_count(l);
  return count;
}

int64_t Replica::parameter_count(size_t l) const {
  int64_t count = 0;
  for (auto& spec : network_.layers()[l].specs)
    if (spec.role == TensorRole::parameter) count += element_count(spec.shape);
  return count;
}

Network::Bound Replica::bound(int slot, int k) const {
  Network::Bound inputs;
  for (size_t i = 0; i < staged_inputs_.size(); ++i) inputs[staged_inputs_[i].name] = &staged_input(slot, k, i);
  return inputs;
}

std::map<std::string, const Tensor*> Replica::staged(int slot, int k) const {
  auto inputs = bound(slot, k);
  return {inputs.begin(), inputs.end()};
}

const Tensor& Replica::staged_input(int slot, int k, size_t input) const {
  return *staging_[slot][static_cast<size_t>(k)].inputs[input];
}

void Replica::wait_all() {
  for (auto& micro_batches : train_programs_)
    for (auto& micro_batch : micro_batches)
      for (auto& p : micro_batch.programs) p->wait();
  for (auto& programs : backward_segments_)
    for (auto& p : programs) p->wait();
  for (auto& p : eval_programs_)
    if (p) p->wait();
  if (update_program_) update_program_->wait();
}

void Replica::reset_metrics() {
  wait_all();
  const float zeros[4] = {};
  metrics_->buffer().write(zeros, sizeof zeros);
}

std::array<double, 3> Replica::read_metrics() {
  wait_all();
  float m[4];
  metrics_->buffer().read(m, sizeof m);
  return {m[0], m[1], m[2]};
}

void Replica::score(int slot, BinaryScores& scores) {
  eval_programs_[slot]->wait();
  const Tensor& labels = staged_input(slot, 0, labels_input_);
  std::vector<uint32_t> label_values(static_cast<size_t>(labels.count()));
  labels.download(label_values.data(), labels.bytes());
  uint32_t valid = 0;
  staged_input(slot, 0, valid_input_).download(&valid, sizeof valid);
  scores.add(logits_.output->download(), label_values, valid);
}

std::map<std::string, Tensor*> Replica::checkpoint_tensors() {
  std::map<std::string, Tensor*> tensors;
  for (auto& named : network_.named_tensors()) tensors[named.name] = named.tensor;
  return tensors;
}

std::map<std::string, Tensor*> Replica::state_tensors() {
  std::map<std::string, Tensor*> tensors;
  for (auto& named : network_.named_tensors())
    if (!named.grad) tensors[named.name] = named.tensor;
  return tensors;
}

std::map<std::string, Tensor*> Replica::train_tensors() {
  std::map<std::string, Tensor*> tensors{{"step", step_.get()}};
  for (auto& [name, states] : optimizer_states_)
    for (auto& state : states) tensors["optimizer/" + state->name()] = state.get();
  if (loss_scale_) tensors["loss_scale"] = loss_scale_tensor_.get();
  return tensors;
}

std::optional<LossScaleState> Replica::loss_scale_state() const {
  if (!loss_scale_) return std::nullopt;
  return loss_scale_->download();
}

void Replica::record_update(vk::Recorder& recorder) {
  auto& kernels = context_.kernels();
  auto named_tensors = network_.named_tensors();
  if (loss_scale_) {
    recorder.set_scope("loss scale");
    for (auto& named : named_tensors)
      if (named.grad) loss_scale_->record_check(recorder, kernels, *named.grad);
  }
  recorder.set_scope("optimizer");
  for (auto& named : named_tensors) {
    if (!named.grad) continue;
    std::vector<const Tensor*> states;
    for (auto& s : optimizer_states_[named.name]) states.push_back(s.get());
    optimizer_->record_update(recorder, kernels, *named.tensor, *named.grad, states, *step_, loss_scale_tensor_.get());
  }
  Optimizer::record_step_advance(recorder, kernels, *step_);
  if (loss_scale_) loss_scale_->record_update(recorder, kernels);
}

std::vector<GradientSegment> Replica::plan_segments() const {
  size_t layers = network_.layers().size();
  int with_parameters = 0;
  for (size_t l = 0; l < layers; ++l) with_parameters += parameter_count(l) > 0 ? 1 : 0;
  // --sync-bn already waits for every replica at each batch norm: one segment.
  constexpr int kSegments = 4;
  int wanted = synced() ? 1 : std::max(1, std::min(kSegments, with_parameters));
  auto target = static_cast<size_t>((gradient_count() + wanted - 1) / wanted);
  std::vector<GradientSegment> planned;
  GradientSegment current{0, layers, 0};
  for (size_t l = layers; l-- > 0;) {
    current.count += static_cast<size_t>(parameter_count(l));
    if (l > 0 && current.count >= target && static_cast<int>(planned.size()) + 1 < wanted) {
      current.begin = l;
      planned.push_back(current);
      current = {0, l, 0};
    }
  }
  planned.push_back(current);
  return planned;
}

template <class Visit>
void Replica::for_each_gradient(const GradientSegment& segment, Visit&& visit) const {
  auto& layers = network_.layers();
  for (size_t l = segment.end; l-- > segment.begin;)
    for (size_t i = 0; i < layers[l].specs.size(); ++i)
      if (layers[l].specs[i].role == TensorRole::parameter)
        visit(*layers[l].grads[i], *host_gradients_.at(layers[l].grads[i].get()));
}

// Copies between the gradients of layers [begin, end) and their host copies.
void Replica::record_gradient_copies(vk::Recorder& recorder, bool to_host, const GradientSegment& segment) {
  recorder.set_scope("gradient exchange");
  for_each_gradient(segment, [&](const Tensor& grad, const Tensor& host) {
    if (grad.dtype() != DType::f32) throw std::logic_error("the gradient exchange sums float32 gradients");
    if (to_host)
      recorder.copy(grad.buffer(), 0, host.buffer(), 0, grad.bytes());
    else
      recorder.copy(host.buffer(), 0, grad.buffer(), 0, grad.bytes());
  });
}

void Replica::record() {
  auto& kernels = context_.kernels();
  if (replicated_) segments_ = plan_segments();
  for (int slot = 0; slot < slots_; ++slot) {
    for (int k = 0; k < settings_.accumulate; ++k) {
      bool last = k == settings_.accumulate - 1;
      recording_ = &train_programs_[slot].emplace_back();
      recording_staging_ = &staging(slot, k);
      recording_->programs.push_back(std::make_unique<vk::Program>(context_));
      vk::Recorder recorder(context_, *recording_->programs.back());
      // Dropout draws by the sample's place in the whole batch, whichever replica computes it.
      Network::Pass pass{true, settings_.seed, step_.get(), static_cast<uint32_t>(k * batch_ + part_.first),
                         synced() ? this : nullptr};
      auto inputs = bound(slot, k);
      network_.record_forward(recorder, kernels, inputs, pass);
      record_metrics(recorder, slot, k);
      const Tensor& dloss = *network_.layer("loss").output_grad;
      if (!replicated_) {
        if (loss_scale_) {
          recorder.set_scope("loss scale");
          for (auto& [loss, weight] : losses_)
            loss_scale_->record_loss_gradient(recorder, kernels, *loss->output_grad,
                                              weight / static_cast<float>(settings_.accumulate));
        }
        network_.record_backward(recorder, kernels, inputs, pass);
        if (last) record_update(recorder);
        recorder.finish();
        continue;
      }
      recorder.copy(staging(slot, k).loss_weight->buffer(), 0, dloss.buffer(), 0, dloss.bytes());
      if (loss_scale_) {
        recorder.set_scope("loss scale");
        loss_scale_->record_loss_gradient(recorder, kernels, dloss, std::nullopt);
      }
      if (!last) {
        network_.record_backward(recorder, kernels, inputs, pass);
        recorder.finish();
        continue;
      }
      for (size_t s = 0; s < segments_.size(); ++s) {
        std::optional<vk::Recorder> next;
        if (s > 0) {
          backward_segments_[slot].push_back(std::make_unique<vk::Program>(context_));
          next.emplace(context_, *backward_segments_[slot].back());
        }
        vk::Recorder& into = s > 0 ? *next : recorder;
        network_.record_backward(into, kernels, inputs, pass, segments_[s].begin, segments_[s].end);
        record_gradient_copies(into, true, segments_[s]);
        into.finish();
      }
    }
    eval_programs_[slot] = std::make_unique<vk::Program>(context_);
    vk::Recorder recorder(context_, *eval_programs_[slot]);
    network_.record_forward(recorder, kernels, bound(slot, 0), Network::Pass{false, settings_.seed, step_.get(), 0});
    record_metrics(recorder, slot, 0);
    recorder.finish();
  }
  recording_ = nullptr;
  recording_staging_ = nullptr;
  if (replicated_) {
    update_program_ = std::make_unique<vk::Program>(context_);
    vk::Recorder recorder(context_, *update_program_);
    for (auto& segment : segments_) record_gradient_copies(recorder, false, segment);
    record_update(recorder);
    recorder.finish();
  }
}

void Replica::submit_backward_segments(int slot) {
  for (auto& segment : backward_segments_[slot]) segment->submit();
}

std::vector<std::span<float>> Replica::segment_gradients(int slot, size_t s) {
  vk::Program& program = s == 0 ? *train_programs_[slot].back().programs.back() : *backward_segments_[slot][s - 1];
  program.wait();
  std::vector<std::span<float>> gradients;
  for_each_gradient(segments_[s], [&](const Tensor&, const Tensor& host) {
    host.buffer().invalidate();  // the device's copy reaches non-coherent host memory
    gradients.push_back({static_cast<float*>(host.buffer().mapped()), static_cast<size_t>(host.count())});
  });
  return gradients;
}

void Replica::flush_segment_gradients(size_t s) const {
  for_each_gradient(segments_[s], [](const Tensor&, const Tensor& host) { host.buffer().flush(); });
}

// Ends the program being recorded with a copy of `values` for the host, and begins the next
// with the combined values copied back.
void Replica::exchange(vk::Recorder& recorder, const Tensor& values, Combine combine, int64_t count) {
  const Tensor& host = *recording_staging_->exchanged.at(&values);
  recorder.copy(values.buffer(), 0, host.buffer(), 0, values.bytes());
  recording_->exchanges.push_back({&host, combine, count});
  recording_->programs.push_back(std::make_unique<vk::Program>(context_));
  recorder.continue_in(*recording_->programs.back());
  recorder.copy(host.buffer(), 0, values.buffer(), 0, values.bytes());
}

void Replica::record_metrics(vk::Recorder& recorder, int slot, int k) {
  struct Push {
    uint32_t classes;
  } push{static_cast<uint32_t>(logits_.output_shape[1])};
  recorder.set_scope("metrics");
  auto& kernels = context_.kernels();
  recorder.dispatch(kernel_for<Push>(kernels,
                                     reduction_kernel(kernels, vk::kernel::metrics_accumulate,
                                                      vk::kernel::metrics_accumulate_subgroup),
                                     *logits_.output),
                    {reads(*logits_.output), vk::reads(staged_input(slot, k, labels_input_).buffer()),
                     vk::reads(staged_input(slot, k, valid_input_).buffer()), vk::updates(metrics_->buffer())},
                    push, 1);
  recorder.set_scope("");
}

}  // namespace tessera
