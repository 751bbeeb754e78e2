#include "compute/inference.h"

#include <algorithm>

#include "common/error.h"
#include "common/json_input.h"
#include "compute/ops/registry.h"
#include "compute/safetensors.h"
#include "compute/vit.h"
#include "compute/weight_stream.h"

namespace tessera {

namespace {

// The description with every layer after `layer` removed.
nlohmann::json truncated_after(nlohmann::json description, const std::string& layer) {
  auto& layers = description["layers"];
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i]["name"] == layer) {
      layers.erase(layers.begin() + static_cast<std::ptrdiff_t>(i) + 1, layers.end());
      break;
    }
  return description;
}

uint64_t bytes_of(const Shape& shape, DType dtype) {
  return static_cast<uint64_t>(element_count(shape)) * element_size(dtype);
}

}  // namespace

ResolvedModel resolve_model(const std::string& model, int classes, const std::string& encoder) {
  if (!encoder.empty()) {
    nlohmann::json graph = load_model_description(encoder, classes, 32, "--encoder");
    if (model.empty()) return {std::move(graph), std::nullopt, "", encoder};
    if (is_safetensors_path(model)) return {std::move(graph), std::nullopt, model, model};
    if (!is_checkpoint_path(model))
      throw UsageError("--model " + model + " must hold the weights of --encoder " + encoder +
                       ": a .safetensors file or a checkpoint .h5 (tools/torch_to_tessera.py)");
    Checkpoint checkpoint = read_checkpoint(model);
    if (check_model_description(checkpoint.model, model + " (attribute 'model')") != graph)
      throw UsageError("--model " + model + " holds the weights of " + json_excerpt(checkpoint.model) + ", not of --encoder " +
                       encoder);
    return {std::move(graph), std::move(checkpoint), "", model};
  }
  if (is_safetensors_path(model))
    throw UsageError("--model " + model + " holds weights only: name their architecture with --encoder");
  if (!is_checkpoint_path(model)) return {load_model_description(model, classes), std::nullopt, "", model};
  Checkpoint checkpoint = read_checkpoint(model);
  nlohmann::json graph = check_model_description(checkpoint.model, model + " (attribute 'model')");
  return {std::move(graph), std::move(checkpoint), "", model};
}

namespace {

// The network of the pass: the model up to options.layer between the prologue and nothing.
std::unique_ptr<Network> build_network(const ResolvedModel& model, const InferenceOptions& options,
                                       std::string& layer, const StreamGroups& streaming = {}) try {
  nlohmann::json graph = model.graph;
  layer.clear();
  if (!options.layer.empty()) {
    // The whole graph resolves the name (a module's output is its last sublayer's); only the
    // layers up to it run.
    layer = Network(graph, options.inputs, false, options.prologue).layer(options.layer).name;
    graph = truncated_after(std::move(graph), layer);
  }
  auto network = std::make_unique<Network>(graph, options.inputs, false, options.prologue);
  network->set_activation_dtype(options.activations);
  network->set_weight_dtype(options.weights);
  network->set_streaming(streaming);
  if (layer.empty()) layer = network->layers().back().name;
  return network;
} catch (const ModelError& e) {
  throw model_error_of(model.source, e);
}

// In the order they are allocated: the graph's buffers (an activation's handed on once read,
// the prepared weights kept), the inputs, the step count the ops read.
MemoryPlan plan_of(const Network& network, const InferenceOptions& options, const vk::Allocator& allocator) {
  MemoryPlan plan = network.plan(allocator);
  for (auto& input : options.inputs)
    plan.add(allocator, "inputs", bytes_of(input.shape, input.dtype), options.input_memory, input.name,
             network.input_windowed(input.name));
  plan.add(allocator, "inputs", InferenceProgram::step_bytes);
  // Weights (and device-memory inputs) are uploaded one at a time, through a staging buffer
  // where device memory is not mapped.
  uint64_t largest = 0;
  for (auto& layer : network.layers())
    for (auto& spec : layer.specs)
      if (in_checkpoint(spec.role)) largest = std::max(largest, bytes_of(spec.shape, spec.dtype));
  if (options.input_memory == vk::MemoryUsage::device)
    for (auto& input : options.inputs) largest = std::max(largest, bytes_of(input.shape, input.dtype));
  // No kernel binds it: copies alone read it.
  if (allocator.transfer_footprint(largest)) plan.add(allocator, "staging", largest, vk::MemoryUsage::staging, {}, true);
  if (const StreamGroups& streaming = network.streaming(); streaming.active()) {
    plan.streaming = {streaming.groups, streaming.blocks_per_group, streaming.slots, 0};
    for (auto& buffer : network.layout().buffers)
      if (buffer.category == kStreamedHostCategory) plan.streaming.streamed_bytes += buffer.bytes;
  }
  return plan;
}

// Which blocks stream (InferenceOptions::stream_weights): none where the resident plan fits the
// budget, else groups of the most blocks whose plan fits with at least four groups, so that the
// ring of two slots holds at most half the blocks; one block a group where none fits (the plan
// then says by how much).
StreamGroups choose_streaming(const ResolvedModel& model, const InferenceOptions& options,
                              const vk::Allocator& allocator) {
  if (options.stream_weights == WeightStreaming::off) return {};
  std::string layer;
  std::unique_ptr<Network> network = build_network(model, options, layer);
  const uint64_t budget = allocator.stats().budget_bytes;
  auto fits = [&] { return plan_of(*network, options, allocator).device_bytes(allocator) <= budget; };
  const int blocks = stream_block_count(*network);
  if (blocks == 0 || (options.stream_weights == WeightStreaming::automatic && fits())) return {};
  for (int per_group = std::max(blocks / 4, 1); per_group > 1; --per_group) {
    network->set_streaming(stream_groups(*network, per_group));
    if (fits()) return network->streaming();
  }
  return stream_groups(*network, 1);
}

// The options with every input's first dimension (the batch) set to `batch`.
InferenceOptions at_batch(InferenceOptions options, int64_t batch) {
  for (auto& input : options.inputs) input.shape[0] = batch;
  return options;
}

}  // namespace

MemoryPlan plan_inference(vk::Context& context, const ResolvedModel& model, const InferenceOptions& options) {
  std::string layer;
  StreamGroups streaming = choose_streaming(model, options, context.allocator());
  return plan_of(*build_network(model, options, layer, streaming), options, context.allocator());
}

WeightsCheck check_weights(const ResolvedModel& model, const InferenceOptions& options) {
  std::string layer;
  std::unique_ptr<Network> network = build_network(model, options, layer);
  WeightsCheck check{network->named_tensors().size(), 0, network->output_shape()};
  if (model.checkpoint) {
    // read_checkpoint read every value and refused any that is not finite; fp16 weights must
    // also lie within its range.
    std::map<std::string, Shape> needed;
    for (auto& named : network->named_tensors()) {
      needed[named.name] = named.spec.shape;
      check.values += static_cast<uint64_t>(element_count(named.spec.shape));
    }
    check_arrays_fit(model.checkpoint->params, needed, model.source, "params");
    for (auto& named : network->named_tensors())
      refuse_unrepresentable(model.checkpoint->params.at(named.name).values, named.spec.dtype,
                             model.source + ": dataset params/" + named.name);
  } else if (!model.safetensors.empty()) {
    check.values = check_safetensors(model.safetensors, *network, timm_parameter_piece);
  }
  return check;
}

BatchLimit batch_within(const ResolvedModel& model, const InferenceOptions& options, int64_t batch,
                        uint64_t largest_buffer) {
  // The largest buffer at batch b: every activation grows with the batch, weights do not.
  auto largest_at = [&](int64_t b) {
    InferenceOptions sized = at_batch(options, b);
    std::string layer;
    GraphLayout layout = build_network(model, sized, layer)->layout();
    // Its bytes, named by the largest tensor in it (a shared buffer's name says nothing).
    uint64_t bytes = 0;
    for (auto& buffer : layout.buffers) bytes = std::max(bytes, buffer.bytes);
    std::pair<uint64_t, std::string> tensor{0, ""};
    for (auto& placed : layout.tensors)
      if (bytes_of(placed.shape, placed.dtype) > tensor.first)
        tensor = {bytes_of(placed.shape, placed.dtype),
                  placed.name + (placed.kind == GraphLayout::Kind::output ? "'s output" : "")};
    for (auto& input : sized.inputs) {
      bytes = std::max(bytes, bytes_of(input.shape, input.dtype));
      if (bytes_of(input.shape, input.dtype) > tensor.first) tensor = {bytes_of(input.shape, input.dtype), input.name};
    }
    return std::pair{bytes, tensor.second};
  };
  auto [bytes, name] = largest_at(batch);
  BatchLimit limit{batch, name, bytes};
  if (bytes <= largest_buffer) return limit;
  int64_t fits = 0, over = batch;  // the answer lies in [fits, over)
  while (over - fits > 1) {
    int64_t middle = fits + (over - fits) / 2;
    (largest_at(middle).first <= largest_buffer ? fits : over) = middle;
  }
  limit.batch = fits;
  return limit;
}

Inference::Inference(vk::Context& context, const ResolvedModel& model, const InferenceOptions& options)
    : context_(context) {
  network_ = build_network(model, options, layer_, choose_streaming(model, options, context.allocator()));
  plan_ = plan_of(*network_, options, context.allocator());
  check_plan_fits(context, plan_, options.advice);

  network_->allocate(context);
  for (auto& input : options.inputs)
    inputs_[input.name] = std::make_unique<Tensor>(context, input.name, input.shape, input.dtype, options.input_memory,
                                                   network_->input_windowed(input.name));
  if (model.checkpoint) {
    std::map<std::string, Tensor*> tensors;
    for (auto& named : network_->named_tensors()) tensors[named.name] = named.tensor;
    load_tensors(model.checkpoint->params, tensors, model.source, "params");
  } else {
    network_->initialise(0);
    if (!model.safetensors.empty()) load_safetensors(model.safetensors, *network_, timm_parameter_piece);
  }
  if (options.weights_digest) {
    std::map<std::string, Tensor*> tensors;
    for (auto& named : network_->named_tensors()) tensors[named.name] = named.tensor;
    weights_digest_ = tessera::weights_digest(tensors);
  }
  network_->prepare(context);
  Network::Bound bound;
  for (auto& [name, tensor] : inputs_) bound[name] = tensor.get();
  program_ = std::make_unique<InferenceProgram>(context, *network_, bound);
}

Inference::~Inference() = default;

const Tensor& Inference::input(const std::string& name) const {
  auto it = inputs_.find(name);
  if (it == inputs_.end()) throw std::logic_error("the inference graph has no input " + name);
  return *it->second;
}

void Inference::run() { program_->run(); }

}  // namespace tessera
