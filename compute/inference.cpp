#include "compute/inference.h"

#include <algorithm>

#include "common/error.h"

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

ResolvedModel resolve_model(const std::string& model, int classes) {
  if (!is_checkpoint_path(model)) return {load_model_description(model, classes), std::nullopt, model};
  Checkpoint checkpoint = read_checkpoint(model);
  nlohmann::json graph = check_model_description(checkpoint.model, model + " (attribute 'model')");
  return {std::move(graph), std::move(checkpoint), model};
}

Inference::Inference(vk::Context& context, const ResolvedModel& model, const InferenceOptions& options)
    : context_(context) {
  nlohmann::json graph = model.graph;
  if (!options.layer.empty()) {
    // The whole graph resolves the name (a module's output is its last sublayer's); only the
    // layers up to it run.
    layer_ = Network(graph, options.inputs, false, options.prologue).layer(options.layer).name;
    graph = truncated_after(std::move(graph), layer_);
  }
  network_ = std::make_unique<Network>(graph, options.inputs, false, options.prologue);
  network_->set_activation_dtype(options.activations);
  if (layer_.empty()) layer_ = network_->layers().back().name;

  // In the order they are allocated: the graph's buffers (an activation's handed on once read,
  // the prepared weights kept), the inputs, the step count the ops read.
  auto& allocator = context.allocator();
  plan_ = network_->plan(allocator);
  for (auto& input : options.inputs) plan_.add(allocator, "inputs", bytes_of(input.shape, input.dtype), options.input_memory);
  plan_.add(allocator, "inputs", InferenceProgram::step_bytes);
  // Weights (and device-memory inputs) are uploaded one at a time, through a staging buffer
  // where device memory is not mapped.
  uint64_t largest = 0;
  for (auto& layer : network_->layers())
    for (auto& spec : layer.specs)
      if (in_checkpoint(spec.role)) largest = std::max(largest, bytes_of(spec.shape, spec.dtype));
  if (options.input_memory == vk::MemoryUsage::device)
    for (auto& input : options.inputs) largest = std::max(largest, bytes_of(input.shape, input.dtype));
  if (allocator.transfer_footprint(largest)) plan_.add(allocator, "staging", largest, vk::MemoryUsage::staging);
  check_plan_fits(context, plan_, options.advice);

  network_->allocate(context);
  for (auto& input : options.inputs)
    inputs_[input.name] = std::make_unique<Tensor>(context, input.name, input.shape, input.dtype, options.input_memory);
  if (model.checkpoint) {
    std::map<std::string, Tensor*> tensors;
    for (auto& named : network_->named_tensors()) tensors[named.name] = named.tensor;
    load_tensors(model.checkpoint->params, tensors, model.source, "params");
  } else {
    network_->initialise(0);
  }
  if (options.weights_digest) {
    std::map<std::string, Tensor*> tensors;
    for (auto& named : network_->named_tensors()) tensors[named.name] = named.tensor;
    weights_digest_ = tessera::weights_digest(download_tensors(tensors));
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
