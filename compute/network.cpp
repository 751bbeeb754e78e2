#include "compute/network.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "compute/ops/batch_norm2d.h"
#include "compute/ops/registry.h"

namespace tessera {

uint64_t MemoryPlan::total() const {
  uint64_t sum = 0;
  for (auto& [category, size] : bytes) sum += size;
  return sum;
}

namespace {

nlohmann::json layer(const std::string& name, const std::string& type, nlohmann::json fields = nlohmann::json::object(),
                     std::vector<std::string> inputs = {}) {
  fields["name"] = name;
  fields["type"] = type;
  if (!inputs.empty()) fields["inputs"] = inputs;
  return fields;
}

// conv, pool, conv, pool, dense, dropout, dense; channels w, 2w and 4w.
nlohmann::json small_cnn(int classes, int width) {
  nlohmann::json layers = nlohmann::json::array();
  layers.push_back(layer("conv1", "conv2d", {{"out_channels", width}, {"kernel", 3}, {"padding", 1}}));
  layers.push_back(layer("relu1", "relu"));
  layers.push_back(layer("pool1", "max_pool2d", {{"kernel_size", 2}}));
  layers.push_back(layer("conv2", "conv2d", {{"out_channels", 2 * width}, {"kernel", 3}, {"padding", 1}}));
  layers.push_back(layer("relu2", "relu"));
  layers.push_back(layer("pool2", "max_pool2d", {{"kernel_size", 2}}));
  layers.push_back(layer("flatten", "flatten"));
  layers.push_back(layer("fc1", "linear", {{"out_features", 4 * width}}));
  layers.push_back(layer("relu3", "relu"));
  layers.push_back(layer("dropout", "dropout", {{"p", 0.5}}));
  layers.push_back(layer("fc2", "linear", {{"out_features", classes}}));
  return {{"name", "small-cnn"}, {"layers", layers}};
}

// torchvision's resnet18 (basic blocks) and resnet50 (bottlenecks, stride on the 3x3 conv as
// torchvision's v1.5): the names of parameters match its state_dict. A block's layers end in
// "<stage>.<block>.relu<last>", so that "layer1.0" and "layer1" name the outputs PyTorch's
// modules of those names give (see Network::layer).
nlohmann::json resnet(const std::string& name, int classes, bool bottleneck, const std::vector<int>& blocks) {
  nlohmann::json layers = nlohmann::json::array();
  auto conv = [](const std::string& conv_name, int out, int kernel, int stride, int padding, std::string input) {
    return layer(conv_name, "conv2d",
                 {{"out_channels", out}, {"kernel", kernel}, {"stride", stride}, {"padding", padding}, {"bias", false}},
                 {std::move(input)});
  };
  layers.push_back(conv("conv1", 64, 7, 2, 3, "input"));
  layers.push_back(layer("bn1", "batch_norm2d"));
  layers.push_back(layer("relu", "relu"));
  layers.push_back(layer("maxpool", "max_pool2d", {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}));
  std::string previous = "maxpool";
  int channels = 64;
  const int expansion = bottleneck ? 4 : 1;
  for (int stage = 1; stage <= static_cast<int>(blocks.size()); ++stage) {
    int width = 64 << (stage - 1), out = width * expansion;
    for (int block = 0; block < blocks[static_cast<size_t>(stage - 1)]; ++block) {
      std::string prefix = "layer" + std::to_string(stage) + "." + std::to_string(block) + ".";
      int stride = (stage > 1 && block == 0) ? 2 : 1;
      // Basic: 3x3 (stride), 3x3. Bottleneck: 1x1, 3x3 (stride), 1x1 to width * 4.
      std::vector<std::pair<int, int>> convs;  // (kernel, stride)
      if (bottleneck)
        convs = {{1, 1}, {3, stride}, {1, 1}};
      else
        convs = {{3, stride}, {3, 1}};
      std::string branch = previous;
      for (size_t c = 0; c < convs.size(); ++c) {
        auto index = std::to_string(c + 1);
        bool last = c + 1 == convs.size();
        auto [kernel, conv_stride] = convs[c];
        layers.push_back(conv(prefix + "conv" + index, last ? out : width, kernel, conv_stride, kernel / 2, branch));
        layers.push_back(layer(prefix + "bn" + index, "batch_norm2d"));
        branch = prefix + "bn" + index;
        if (!last) {
          layers.push_back(layer(prefix + "relu" + index, "relu"));
          branch = prefix + "relu" + index;
        }
      }
      std::string identity = previous;
      if (stride != 1 || channels != out) {
        layers.push_back(conv(prefix + "downsample.0", out, 1, stride, 0, previous));
        layers.push_back(layer(prefix + "downsample.1", "batch_norm2d"));
        identity = prefix + "downsample.1";
      }
      layers.push_back(layer(prefix + "add", "add", {}, {branch, identity}));
      previous = prefix + "relu" + std::to_string(convs.size());
      layers.push_back(layer(previous, "relu"));
      channels = out;
    }
  }
  layers.push_back(layer("avgpool", "global_avg_pool"));
  layers.push_back(layer("fc", "linear", {{"out_features", classes}}));
  return {{"name", name}, {"layers", layers}};
}

uint32_t name_hash(const std::string& name) {
  return static_cast<uint32_t>(std::hash<std::string>{}(name) & 0xffffffffu);
}

}  // namespace

nlohmann::json expand_presets(const nlohmann::json& description) {
  if (!description.is_object() || !description.contains("preset")) return description;
  auto& preset = description["preset"];
  if (!preset.is_string()) throw ModelError("model: field 'preset' must be a string");
  auto classes = description.value("classes", 2);
  auto width = description.value("width", 32);
  if (classes < 1) throw ModelError("model: field 'classes' must be at least 1");
  if (width < 1) throw ModelError("model: field 'width' must be at least 1");
  if (preset == "small-cnn") return small_cnn(classes, width);
  if (preset == "resnet18") return resnet("resnet18", classes, false, {2, 2, 2, 2});
  if (preset == "resnet50") return resnet("resnet50", classes, true, {3, 4, 6, 3});
  throw ModelError("model: preset '" + preset.get<std::string>() + "' is not known (small-cnn, resnet18, resnet50)");
}

nlohmann::json load_model_description(const std::string& model, int classes, int width) {
  if (model == "small-cnn" || model == "resnet18" || model == "resnet50")
    return expand_presets({{"preset", model}, {"classes", classes}, {"width", width}});
  if (!std::filesystem::exists(model))
    throw BadInput("--model " + model + ": neither a preset (small-cnn, resnet18, resnet50) nor an existing file");
  std::ifstream in(model);
  nlohmann::json description;
  try {
    description = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw ModelError(model + ": not valid JSON: " + e.what());
  }
  if (description.contains("preset")) {
    description["classes"] = description.value("classes", classes);
    description["width"] = description.value("width", width);
  }
  return expand_presets(description);
}

Network::Network(const nlohmann::json& description, const Shape& input_shape, bool with_gradients)
    : description_(expand_presets(description)), input_shape_(input_shape), with_gradients_(with_gradients) {
  auto layers = description_.find("layers");
  if (layers == description_.end() || !layers->is_array() || layers->empty())
    throw ModelError("model: field 'layers' must be a non-empty array of layers");
  std::map<std::string, int> index_of{{"input", -1}};
  for (auto& entry : *layers) {
    LayerConfig config(entry);
    if (index_of.count(config.name())) config.fail("name", "'" + config.name() + "' is used twice");
    Layer l;
    l.name = config.name();
    l.op = make_op(config);
    std::vector<std::string> input_names;
    if (auto inputs = entry.find("inputs"); inputs != entry.end()) {
      if (!inputs->is_array() || inputs->empty()) config.fail("inputs", "must be a non-empty array of layer names");
      for (auto& name : *inputs) {
        if (!name.is_string()) config.fail("inputs", "must hold layer names, got " + name.dump());
        input_names.push_back(name.get<std::string>());
      }
    } else {
      input_names.push_back(layers_.empty() ? "input" : layers_.back().name);
    }
    std::vector<Shape> shapes;
    for (auto& name : input_names) {
      auto it = index_of.find(name);
      if (it == index_of.end())
        config.fail("inputs", "names '" + name + "', which is not an earlier layer (or 'input')");
      l.inputs.push_back(it->second);
      shapes.push_back(it->second < 0 ? input_shape_ : layers_[static_cast<size_t>(it->second)].output_shape);
    }
    try {
      l.output_shape = l.op->infer(shapes);
    } catch (const ShapeError& e) {
      std::string sources;
      for (size_t i = 0; i < input_names.size(); ++i)
        sources += (i ? " and '" : "'") + input_names[i] + "' " + to_string(shapes[i]);
      throw ModelError("model: layer '" + l.name + "' (" + config.type() + ") cannot take the output of " +
                       sources + ": " + e.what());
    }
    l.specs = l.op->tensors();
    index_of[l.name] = static_cast<int>(layers_.size());
    layers_.push_back(std::move(l));
  }
  // In backward order, the first consumer of a tensor writes its gradient, later ones add.
  std::vector<bool> written(layers_.size(), false);
  for (size_t l = layers_.size(); l-- > 0;)
    for (size_t j = 0; j < layers_[l].inputs.size(); ++j) {
      int producer = layers_[l].inputs[j];
      if (producer < 0) continue;
      accumulate_input_grad_[{l, j}] = written[static_cast<size_t>(producer)];
      written[static_cast<size_t>(producer)] = true;
    }
  plan_fusion();
}

void Network::plan_fusion() {
  std::vector<int> consumers(layers_.size(), 0);
  for (auto& l : layers_)
    for (int producer : l.inputs)
      if (producer >= 0) ++consumers[static_cast<size_t>(producer)];
  // The producer of layer l's only input when l is that producer's only consumer, else -1.
  auto sole_producer = [&](size_t l) {
    auto& inputs = layers_[l].inputs;
    return inputs.size() == 1 && inputs[0] >= 0 && consumers[static_cast<size_t>(inputs[0])] == 1 ? inputs[0] : -1;
  };
  folded_.resize(layers_.size());
  for (bool training : {false, true}) {
    auto& fused = fusion_[training];
    fused.assign(layers_.size(), Fused{});
    // The layer whose pass computes layer l's output.
    std::vector<int> computed_by(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      computed_by[l] = static_cast<int>(l);
      int producer = sole_producer(l);
      if (producer < 0) continue;
      auto host = static_cast<size_t>(computed_by[static_cast<size_t>(producer)]);
      std::string type = layers_[l].op->type(), host_type = layers_[host].op->type();
      bool fold = !training && type == "batch_norm2d" && host_type == "conv2d" && fused[host].folded_batch_norm < 0 &&
                  !fused[host].relu;
      bool relu = type == "relu" && !fused[host].relu &&
                  (host_type == "conv2d" || host_type == "linear" || host_type == "batch_norm2d" || host_type == "add");
      if (!fold && !relu) continue;
      fused[l].skipped = true;
      fused[host].writes_output_of = static_cast<int>(l);
      if (fold) fused[host].folded_batch_norm = static_cast<int>(l);
      if (relu) fused[host].relu = true;
      computed_by[l] = static_cast<int>(host);
    }
  }
}

std::vector<PlannedTensor> Network::planned_tensors() const {
  std::vector<PlannedTensor> planned;
  for (auto& l : layers_) {
    for (auto& spec : l.specs) {
      std::string full = l.name + "." + spec.name;
      switch (spec.role) {
        case TensorRole::parameter:
          planned.push_back({full, spec.shape, spec.dtype, "parameters"});
          if (with_gradients_) planned.push_back({full + ".grad", spec.shape, DType::f32, "gradients"});
          break;
        case TensorRole::state: planned.push_back({full, spec.shape, spec.dtype, "parameters"}); break;
        case TensorRole::saved: planned.push_back({full, spec.shape, spec.dtype, "activations"}); break;
      }
    }
    planned.push_back({l.name, l.output_shape, DType::f32, "activations"});
    if (with_gradients_) planned.push_back({l.name + ".grad", l.output_shape, DType::f32, "activation gradients"});
  }
  return planned;
}

void Network::allocate(vk::Context& context) {
  for (auto& l : layers_) {
    for (auto& spec : l.specs) {
      l.tensors.push_back(std::make_unique<Tensor>(context, l.name + "." + spec.name, spec.shape, spec.dtype));
      bool trained = spec.role == TensorRole::parameter && with_gradients_;
      l.grads.push_back(trained ? std::make_unique<Tensor>(context, l.name + "." + spec.name + ".grad", spec.shape)
                                : nullptr);
    }
    l.output = std::make_unique<Tensor>(context, l.name, l.output_shape);
    if (with_gradients_) l.output_grad = std::make_unique<Tensor>(context, l.name + ".grad", l.output_shape);
  }
}

void Network::initialise(uint32_t seed) {
  for (auto& named : named_tensors()) {
    std::vector<float> values(static_cast<size_t>(named.tensor->count()));
    std::mt19937 generator(seed ^ name_hash(named.name));
    const Init& init = named.spec.init;
    switch (init.kind) {
      case Init::zeros: std::fill(values.begin(), values.end(), 0.0f); break;
      case Init::ones: std::fill(values.begin(), values.end(), 1.0f); break;
      case Init::uniform: {
        std::uniform_real_distribution<float> distribution(-init.scale, init.scale);
        for (auto& v : values) v = distribution(generator);
        break;
      }
      case Init::normal: {
        std::normal_distribution<float> distribution(0.0f, init.scale);
        for (auto& v : values) v = distribution(generator);
        break;
      }
    }
    named.tensor->upload(values);
    if (named.grad) named.grad->upload(std::vector<float>(values.size(), 0.0f));
  }
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
  for (auto& l : layers_)
    for (size_t s = 0; s < l.specs.size(); ++s) {
      if (l.specs[s].role == TensorRole::saved) continue;
      named.push_back({l.name + "." + l.specs[s].name, l.tensors[s].get(), l.grads[s].get(), l.specs[s]});
    }
  return named;
}

OpTensors Network::bindings(size_t index, const Tensor& input, bool training, uint32_t seed, const Tensor& step,
                            uint32_t sample_offset, bool backward) {
  Layer& l = layers_[index];
  OpTensors t;
  for (size_t j = 0; j < l.inputs.size(); ++j) {
    int producer = l.inputs[j];
    t.inputs.push_back(producer < 0 ? &input : layers_[static_cast<size_t>(producer)].output.get());
    if (backward) {
      t.input_grads.push_back(producer < 0 ? nullptr : layers_[static_cast<size_t>(producer)].output_grad.get());
      t.accumulate_input_grads.push_back(accumulate_input_grad_[{index, j}]);
    }
  }
  const Fused& fused = fusion_[training][index];
  Layer& target = fused.writes_output_of < 0 ? l : layers_[static_cast<size_t>(fused.writes_output_of)];
  t.output = target.output.get();
  t.output_grad = backward ? target.output_grad.get() : nullptr;
  t.relu = fused.relu;
  if (fused.folded_batch_norm >= 0) {
    Layer& bn = layers_[static_cast<size_t>(fused.folded_batch_norm)];
    folded_[index] = {bn.tensors[0].get(), bn.tensors[1].get(), bn.tensors[2].get(), bn.tensors[3].get(),
                      static_cast<const BatchNorm2d&>(*bn.op).eps()};
    t.folded_batch_norm = &folded_[index];
  }
  for (size_t s = 0; s < l.tensors.size(); ++s) {
    t.tensors.push_back(l.tensors[s].get());
    t.grads.push_back(l.grads[s].get());
  }
  t.training = training;
  t.seed = seed ^ name_hash(l.name);
  t.step = &step;
  t.sample_offset = sample_offset;
  return t;
}

void Network::record_forward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& input, bool training,
                             uint32_t seed, const Tensor& step, uint32_t sample_offset) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (fusion_[training][l].skipped) continue;
    recorder.set_scope(layers_[l].name);
    layers_[l].op->forward(recorder, kernels, bindings(l, input, training, seed, step, sample_offset, false));
  }
  recorder.set_scope("");
}

void Network::record_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& input, uint32_t seed,
                              const Tensor& step, uint32_t sample_offset) {
  for (size_t l = layers_.size(); l-- > 0;) {
    if (fusion_[true][l].skipped) continue;
    recorder.set_scope(layers_[l].name + " backward");
    layers_[l].op->backward(recorder, kernels, bindings(l, input, true, seed, step, sample_offset, true));
  }
  recorder.set_scope("");
}

}  // namespace tessera
