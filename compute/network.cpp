#include "compute/network.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string_view>

#include "common/json_input.h"
#include "compute/cnn_presets.h"
#include "compute/ops/registry.h"
#include "compute/vit.h"
#include "compute/weight_stream.h"

namespace tessera {

namespace {

// A description file: a ResNet-152 graph is 60 KB, a ViT's settings under 1 KB.
constexpr uint64_t kMaxDescriptionBytes = 16ull << 20;
// Layers of a graph: a ResNet-152 has 500, a ViT of the deepest depth vit_graph allows (256) 2800.
constexpr size_t kMaxLayers = 4096;

std::string preset_list() { return "small-cnn, resnet18, resnet50, " + vit_preset_list() + "; TRIDENT's names in brackets"; }

// Values of one tensor: 2^40 (4 TiB of fp32) is past every device's memory, and keeps the sums of
// a plan of up to kMaxLayers layers far from 2^64 (every size is a product of fields and inputs).
constexpr int64_t kMaxTensorValues = int64_t{1} << 40;

void refuse_oversized(const std::string& layer, const std::string& tensor, const Shape& shape) {
  int64_t count = 1;
  for (int64_t extent : shape)
    if (extent < 0 || __builtin_mul_overflow(count, extent, &count) || count > kMaxTensorValues)
      throw ModelError("model: layer '" + layer + "': " + tensor + " " + to_string(shape) +
                       " holds more than 2^40 values (at this batch)");
}

uint32_t name_hash(const std::string& name) {
  return static_cast<uint32_t>(std::hash<std::string>{}(name) & 0xffffffffu);
}

}  // namespace

void require_fp16_storage(const vk::DeviceInfo& device, const std::string& command, const std::string& flag) {
  if (!device.fp16_storage)
    throw UsageError(command + " " + flag + " fp16: " + device.name +
                     " cannot store 16-bit floats in storage buffers (no storageBuffer16BitAccess); use " + flag +
                     " fp32");
}

nlohmann::json expand_presets(const nlohmann::json& description) {
  if (is_vit_description(description)) return vit_graph(description);
  if (!description.is_object() || !description.contains("preset")) return description;
  auto& preset = description["preset"];
  if (!preset.is_string()) throw ModelError("model: field 'preset' must be a string");
  // A whole number in [1, most], read before it reaches an int.
  auto bounded = [&](const char* field, int fallback, int64_t most) {
    auto value = description.find(field);
    if (value == description.end()) return fallback;
    if (!value->is_number_integer() || value->get<int64_t>() < 1 || value->get<int64_t>() > most)
      throw ModelError(std::string("model: field '") + field + "' must be an integer from 1 to " +
                       std::to_string(most) + ", got " + json_excerpt(*value));
    return static_cast<int>(value->get<int64_t>());
  };
  const int classes = bounded("classes", 2, kMaxLayerInteger);
  // small-cnn's fc1 has 4 x width features, a layer field like any other.
  const int width = bounded("width", 32, kMaxLayerInteger / 4);
  if (preset == "small-cnn") return small_cnn(classes, width);
  if (preset == "resnet18") return resnet("resnet18", classes, false, {2, 2, 2, 2});
  if (preset == "resnet50") return resnet("resnet50", classes, true, {3, 4, 6, 3});
  throw ModelError("model: preset '" + quoted_excerpt(preset.get<std::string>()) + "' is not known (" + preset_list() +
                   ")");
}

ModelError model_error_of(const std::string& source, const ModelError& error) {
  std::string_view problem = error.what();
  if (problem.rfind(source + ": ", 0) == 0) return error;
  if (problem.rfind("model: ", 0) == 0) problem.remove_prefix(7);
  return ModelError(source + ": " + std::string(problem));
}

nlohmann::json check_model_description(const nlohmann::json& description, const std::string& source) {
  std::string where = "the model";
  // Messages of the layer checks start "model: "; here the file says whose model it is.
  auto fail = [&](std::string problem) {
    if (problem.rfind("model: ", 0) == 0) problem.erase(0, 7);
    return ModelError(source + ": " + where + ": " + problem);
  };
  try {
    nlohmann::json graph = expand_presets(description);
    if (!graph.is_object())
      throw fail(std::string("must be a JSON object with 'layers' (or 'preset'), not ") + graph.type_name());
    where = "/layers";
    auto layers = graph.find("layers");
    if (layers == graph.end() || !layers->is_array() || layers->empty())
      throw fail("must be a non-empty array of layers");
    if (layers->size() > kMaxLayers)
      throw fail("holds " + std::to_string(layers->size()) + " layers (at most " + std::to_string(kMaxLayers) + ")");
    for (size_t i = 0; i < layers->size(); ++i) {
      where = "/layers/" + std::to_string(i);
      const nlohmann::json& entry = (*layers)[i];
      LayerConfig config(entry);
      make_op(config);
      if (auto inputs = entry.find("inputs"); inputs != entry.end())
        if (!inputs->is_array() || inputs->empty() ||
            std::any_of(inputs->begin(), inputs->end(), [](auto& name) { return !name.is_string(); }))
          throw fail("field 'inputs' must be a non-empty array of layer names, got " + json_excerpt(*inputs));
    }
    return graph;
  } catch (const ModelError& e) {
    if (std::string_view(e.what()).rfind(source + ": ", 0) == 0) throw;
    throw fail(e.what());
  } catch (const nlohmann::json::exception& e) {
    throw fail(e.what());
  }
}

nlohmann::json read_model_description(const std::string& path, const std::string& flag) {
  if (!std::filesystem::exists(path))
    throw BadInput(flag + " " + path + ": neither a preset (" + preset_list() + ") nor an existing file");
  return read_json_file(path, path, kMaxDescriptionBytes);
}

nlohmann::json load_model_description(const std::string& model, int classes, int width, const std::string& flag) {
  if (model == "small-cnn" || model == "resnet18" || model == "resnet50")
    return expand_presets({{"preset", model}, {"classes", classes}, {"width", width}});
  // A ViT preset by name is the encoder: its features, no head.
  if (is_vit_description({{"preset", model}})) return expand_presets({{"preset", model}});
  nlohmann::json description = read_model_description(model, flag);
  if (description.is_object() && description.contains("preset") && !is_vit_description(description)) {
    description.emplace("classes", classes);
    description.emplace("width", width);
  }
  return check_model_description(description, model);
}

Network::Network(const nlohmann::json& description, const Shape& input_shape, bool with_gradients)
    : Network(description, {{"input", input_shape}}, with_gradients) {}

Network::Network(const nlohmann::json& description, std::vector<GraphInput> inputs, bool with_gradients,
                 const nlohmann::json& prologue, const nlohmann::json& epilogue)
    : description_(expand_presets(description)), inputs_(std::move(inputs)), with_gradients_(with_gradients) {
  auto layers = description_.find("layers");
  if (layers == description_.end() || !layers->is_array() || layers->empty())
    throw ModelError("model: field 'layers' must be a non-empty array of layers");
  for (size_t i = 0; i < inputs_.size(); ++i) index_of_[inputs_[i].name] = -1 - static_cast<int>(i);
  add_layers(prologue, false);
  add_layers(*layers, true);
  add_layers(epilogue, false);
  finish();
}

Network::Network(std::shared_ptr<Op> op, std::vector<GraphInput> inputs, bool with_gradients)
    : description_(nlohmann::json::object()), inputs_(std::move(inputs)), with_gradients_(with_gradients) {
  std::vector<std::string> names;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    index_of_[inputs_[i].name] = -1 - static_cast<int>(i);
    names.push_back(inputs_[i].name);
  }
  std::string type = op->type();
  add_layer(LayerConfig({{"name", "op"}, {"type", type}}), std::move(op), names, true);
  finish();
}

void Network::add_layers(const nlohmann::json& layers, bool from_model) {
  for (auto& entry : layers) {
    LayerConfig config(entry);
    std::vector<std::string> input_names;
    if (auto inputs = entry.find("inputs"); inputs != entry.end()) {
      if (!inputs->is_array() || inputs->empty()) config.fail("inputs", "must be a non-empty array of layer names");
      for (auto& name : *inputs) {
        if (!name.is_string()) config.fail("inputs", "must hold layer names, got " + json_excerpt(name));
        input_names.push_back(name.get<std::string>());
      }
    } else {
      input_names.push_back(layers_.empty() ? "input" : layers_.back().name);
    }
    add_layer(config, make_op(config), input_names, from_model);
  }
}

void Network::add_layer(const LayerConfig& config, std::shared_ptr<Op> op, const std::vector<std::string>& input_names,
                        bool from_model) {
  if (index_of_.count(config.name())) config.fail("name", "'" + config.name() + "' is used twice");
  Layer l;
  l.name = config.name();
  l.op = std::move(op);
  l.from_model = from_model;
  std::vector<Shape> shapes;
  for (auto& name : input_names) {
    auto it = index_of_.find(name);
    if (it == index_of_.end())
      config.fail("inputs", "names '" + quoted_excerpt(name) + "', which is not an earlier layer (or 'input')");
    l.inputs.push_back(it->second);
    shapes.push_back(it->second < 0 ? inputs_[static_cast<size_t>(-1 - it->second)].shape
                                    : layers_[static_cast<size_t>(it->second)].output_shape);
  }
  try {
    l.output_shape = l.op->infer(shapes);
  } catch (const ShapeError& e) {
    std::string sources;
    for (size_t i = 0; i < input_names.size(); ++i)
      sources += (i ? " and '" : "'") + input_names[i] + "' " + to_string(shapes[i]);
    throw ModelError("model: layer '" + l.name + "' (" + config.type() + ") cannot take the output of " + sources +
                     ": " + e.what());
  }
  l.specs = l.op->tensors();
  refuse_oversized(l.name, config.type() + "'s output", l.output_shape);
  for (auto& spec : l.specs) refuse_oversized(l.name, spec.name, spec.shape);
  index_of_[l.name] = static_cast<int>(layers_.size());
  layers_.push_back(std::move(l));
}

void Network::finish() {
  // A layer takes part in backward when it has parameters or reads something that needs a
  // gradient; the rest (the normalisation of the images) gets no output gradient at all.
  needs_grad_.assign(layers_.size(), false);
  for (size_t l = 0; l < layers_.size(); ++l) {
    bool needs = false;
    for (auto& spec : layers_[l].specs) needs = needs || spec.role == TensorRole::parameter;
    for (int producer : layers_[l].inputs)
      needs = needs || (producer < 0 ? inputs_[static_cast<size_t>(-1 - producer)].gradient
                                     : needs_grad_[static_cast<size_t>(producer)]);
    needs_grad_[l] = needs;
    if (needs && with_gradients_ && !layers_[l].op->has_backward())
      throw ModelError("model: layer '" + layers_[l].name + "' (" + layers_[l].op->type() +
                       ") runs in inference only (forward, extract): it cannot be trained");
  }
  // In backward order, the first consumer of a tensor writes its gradient, later ones add.
  std::map<int, bool> written;
  for (size_t l = layers_.size(); l-- > 0;)
    for (size_t j = 0; j < layers_[l].inputs.size(); ++j) {
      int producer = layers_[l].inputs[j];
      accumulate_input_grad_[{l, j}] = written[producer];
      written[producer] = true;
    }
  plan_fusion();
}

bool Network::input_windowed(const std::string& name) const {
  bool read = false;
  for (auto& layer : layers_)
    for (size_t j = 0; j < layer.inputs.size(); ++j) {
      int producer = layer.inputs[j];
      if (producer >= 0 || inputs_[static_cast<size_t>(-1 - producer)].name != name) continue;
      if (!layer.op->reads_in_windows(j)) return false;
      read = true;
    }
  return read;
}

void Network::allocate(vk::Context& context) {
  GraphLayout layout = this->layout();
  std::vector<std::shared_ptr<vk::Buffer>> buffers;
  for (auto& buffer : layout.buffers)
    buffers.push_back(
        std::make_shared<vk::Buffer>(context.allocator().allocate(buffer.bytes, buffer.usage, buffer.name)));
  input_grads_.resize(inputs_.size());
  for (auto& l : layers_) {
    l.tensors.resize(l.specs.size());
    l.grads.resize(l.specs.size());
    l.ring.resize(l.specs.size());
  }
  for (auto& placed : layout.tensors) {
    auto tensor = std::make_unique<Tensor>(context, placed.name, placed.shape, placed.dtype, buffers[placed.buffer]);
    Layer& l = layers_[placed.layer];
    switch (placed.kind) {
      case GraphLayout::Kind::tensor: l.tensors[placed.index] = std::move(tensor); break;
      case GraphLayout::Kind::grad: l.grads[placed.index] = std::move(tensor); break;
      case GraphLayout::Kind::output: l.output = std::move(tensor); break;
      case GraphLayout::Kind::output_grad: l.output_grad = std::move(tensor); break;
      case GraphLayout::Kind::input_grad: input_grads_[placed.index] = std::move(tensor); break;
      case GraphLayout::Kind::ring: l.ring[placed.index] = std::move(tensor); break;
    }
  }
}

const Tensor& Network::input_grad(const std::string& name) const {
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].name == name && input_grads_.size() > i && input_grads_[i]) return *input_grads_[i];
  throw std::logic_error("the graph computes no gradient of its input " + name);
}

void Network::set_weight_dtype(DType dtype) {
  if (with_gradients_ && dtype != DType::f32) throw std::logic_error("a training network keeps float weights");
  for (auto& layer : layers_)
    for (auto& spec : layer.specs)
      if (spec.follows_weight_dtype && layer.from_model) spec.dtype = dtype;
}

void Network::set_streaming(StreamGroups streaming) {
  if (with_gradients_ && streaming.active()) throw std::logic_error("a training network keeps its weights resident");
  streaming_ = std::move(streaming);
}

void Network::initialise(uint32_t seed) {
  for (auto& l : layers_)
    for (size_t s = 0; s < l.specs.size(); ++s) {
      const TensorSpec& spec = l.specs[s];
      if (!in_checkpoint(spec.role)) continue;
      std::string name = tensor_name(l.name, spec);
      std::vector<float> values(static_cast<size_t>(element_count(spec.shape)));
      std::mt19937 generator(seed ^ name_hash(name));
      switch (spec.init.kind) {
        case Init::zeros: std::fill(values.begin(), values.end(), 0.0f); break;
        case Init::ones: std::fill(values.begin(), values.end(), 1.0f); break;
        case Init::constant: std::fill(values.begin(), values.end(), spec.init.scale); break;
        case Init::uniform: {
          std::uniform_real_distribution<float> distribution(-spec.init.scale, spec.init.scale);
          for (auto& v : values) v = distribution(generator);
          break;
        }
        case Init::normal: {
          std::normal_distribution<float> distribution(0.0f, spec.init.scale);
          for (auto& v : values) v = distribution(generator);
          break;
        }
      }
      l.tensors[s]->upload(values);
      if (l.grads[s]) l.grads[s]->upload(std::vector<float>(values.size(), 0.0f));
    }
}

void Network::prepare(vk::Context& context) {
  if (with_gradients_) throw std::logic_error("only an inference network keeps prepared weights");
  if (prepared_) throw std::logic_error("the network's weights are prepared already");
  vk::Program program(context);
  vk::Recorder recorder(context, program);
  Bound none;  // prepare() reads parameters only: the graph inputs stay unbound (nullptr)
  for (auto& input : inputs_) none[input.name] = nullptr;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (fusion_[false][l].skipped) continue;
    recorder.set_scope(layers_[l].name + " prepare");
    layers_[l].op->prepare(recorder, context.kernels(), bindings(l, none, Pass{}, false));
  }
  recorder.finish();
  program.run();
  prepared_ = true;
}

Network::Layer& Network::layer(const std::string& name) {
  for (auto& l : layers_)
    if (l.name == name) return l;
  // A module's output is the output of its last sublayer, as in PyTorch ("layer1" -> "layer1.1.relu2").
  for (size_t i = layers_.size(); i-- > 0;)
    if (layers_[i].name.rfind(name + ".", 0) == 0) return layers_[i];
  std::string known;
  for (auto& l : layers_) known += (known.empty() ? "" : ", ") + l.name;
  throw UsageError("--layer " + name + ": no such layer (layers: " + known + ")");
}

std::vector<Network::Named> Network::named_tensors() {
  std::vector<Named> named;
  for (auto& l : layers_) {
    if (!l.from_model) continue;
    for (size_t s = 0; s < l.specs.size(); ++s) {
      if (!in_checkpoint(l.specs[s].role)) continue;
      // Before allocate() the names and specs alone, tensors null: weights checked on the host.
      const bool allocated = s < l.tensors.size();
      named.push_back({tensor_name(l.name, l.specs[s]), allocated ? l.tensors[s].get() : nullptr,
                       allocated ? l.grads[s].get() : nullptr, l.specs[s]});
    }
  }
  return named;
}

const Tensor* Network::tensor_of(int producer, const Bound& inputs) const {
  if (producer >= 0) return layers_[static_cast<size_t>(producer)].output.get();
  const std::string& name = inputs_[static_cast<size_t>(-1 - producer)].name;
  auto bound = inputs.find(name);
  if (bound == inputs.end()) throw std::logic_error("graph input " + name + " is not bound");
  return bound->second;
}

OpTensors Network::bindings(size_t index, const Bound& inputs, const Pass& pass, bool backward) const {
  const Layer& l = layers_[index];
  OpTensors t;
  for (size_t j = 0; j < l.inputs.size(); ++j) {
    int producer = l.inputs[j];
    const Tensor* grad = nullptr;
    if (producer < 0) {
      auto input = static_cast<size_t>(-1 - producer);
      if (input < input_grads_.size()) grad = input_grads_[input].get();
    } else {
      grad = layers_[static_cast<size_t>(producer)].output_grad.get();
    }
    t.inputs.push_back(tensor_of(producer, inputs));
    if (backward) {
      t.input_grads.push_back(grad);
      t.accumulate_input_grads.push_back(accumulate_input_grad_.at({index, j}));
    }
  }
  const Fused& fused = fusion_[pass.training][index];
  const Layer& target = fused.writes_output_of < 0 ? l : layers_[static_cast<size_t>(fused.writes_output_of)];
  t.output = target.output.get();
  t.output_grad = backward ? target.output_grad.get() : nullptr;
  t.epilogue.activation = fused.activation;
  if (fused.batch_norm >= 0) {
    const Layer& bn = layers_[static_cast<size_t>(fused.batch_norm)];
    folded_[index] = {bn.tensors[0].get(), bn.tensors[1].get(), bn.tensors[2].get(), bn.tensors[3].get(),
                      bn.op->as_epilogue().eps};
    t.epilogue.batch_norm = &folded_[index];
  }
  if (fused.scale >= 0) t.epilogue.scale = layers_[static_cast<size_t>(fused.scale)].tensors[0].get();
  if (fused.residual >= 0) {
    t.epilogue.residual = tensor_of(layers_[static_cast<size_t>(fused.residual)].inputs[fused.residual_input], inputs);
    t.epilogue.residual_first = fused.residual_first;
  }
  for (size_t s = 0; s < l.tensors.size(); ++s) {
    // Once prepared, a streamed weight is read from its ring slot; prepare() works on the host's.
    const bool ring = prepared_ && !pass.training && s < l.ring.size() && l.ring[s];
    t.tensors.push_back(ring ? l.ring[s].get() : l.tensors[s].get());
    t.grads.push_back(l.grads[s].get());
  }
  t.training = pass.training;
  t.prepared = prepared_ && !pass.training;
  t.seed = pass.seed ^ name_hash(l.name);
  t.step = pass.step;
  t.sample_offset = pass.sample_offset;
  t.sync = pass.training ? pass.sync : nullptr;
  return t;
}

void Network::record_forward(vk::Recorder& recorder, vk::Kernels& kernels, const Bound& inputs, const Pass& pass) {
  const bool streams = prepared_ && !pass.training;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (streams) record_stream_uploads(recorder, *this, l, false);
    if (!fusion_[pass.training][l].skipped) {
      recorder.set_scope(layers_[l].name);
      layers_[l].op->forward(recorder, kernels, bindings(l, inputs, pass, false));
    }
    if (streams) record_stream_uploads(recorder, *this, l, true);
  }
  recorder.set_scope("");
}

void Network::record_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Bound& inputs, const Pass& pass) {
  record_backward(recorder, kernels, inputs, pass, 0, layers_.size());
}

void Network::record_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Bound& inputs, const Pass& pass,
                              size_t begin, size_t end) {
  for (size_t l = end; l-- > begin;) {
    if (!needs_grad_[l] || fusion_[true][l].skipped) continue;
    recorder.set_scope(layers_[l].name + " backward");
    layers_[l].op->backward(recorder, kernels, bindings(l, inputs, pass, true));
  }
  recorder.set_scope("");
}

InferenceProgram::InferenceProgram(vk::Context& context, Network& network, const Network::Bound& inputs)
    : step_(context, "step", {2}, DType::u32), program_(context) {
  uint32_t zero[2] = {0, 0};
  step_.upload(zero, sizeof zero);
  vk::Recorder recorder(context, program_);
  network.record_forward(recorder, context.kernels(), inputs, {false, 0, &step_, 0});
  recorder.finish();
}

}  // namespace tessera
