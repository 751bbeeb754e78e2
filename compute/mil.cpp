#include "compute/mil.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/error.h"
#include "common/progress.h"
#include "compute/checkpoint.h"
#include "compute/ops/attention_gate.h"
#include "compute/ops/attention_pool.h"
#include "compute/ops/instance_mean.h"
#include "compute/ops/linear.h"
#include "compute/ops/softmax_cross_entropy.h"
#include "compute/run_checks.h"
#include "compute/vk/memory.h"

namespace tessera {

namespace {

struct Bag {
  std::string slide;
  uint32_t label = 0;
  int64_t instances = 0;
  std::vector<float> features;  // [instances, width]
};

std::string trim(const std::string& text) {
  auto first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

// `slide,label` rows, an optional header first. Classes are the distinct labels in sorted
// order ("0" < "1", "normal" < "tumor").
std::vector<std::pair<std::string, std::string>> read_labels(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw BadInput(path + ": cannot read the labels file");
  std::vector<std::pair<std::string, std::string>> rows;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (trim(line).empty()) continue;
    auto comma = line.find(',');
    if (comma == std::string::npos || line.find(',', comma + 1) != std::string::npos)
      throw BadInput(path + ":" + std::to_string(number) + ": expected 'slide,label', got '" + trim(line) + "'");
    std::string slide = trim(line.substr(0, comma)), label = trim(line.substr(comma + 1));
    if (number == 1 && slide == "slide" && label == "label") continue;
    if (slide.empty() || label.empty())
      throw BadInput(path + ":" + std::to_string(number) + ": empty slide or label");
    rows.emplace_back(slide, label);
  }
  if (rows.empty()) throw BadInput(path + ": holds no slides");
  return rows;
}

// One feature file as a bag; `width` is the other bags' D (0: none read yet), and becomes this one's.
Bag read_bag_file(const std::string& path, const std::string& slide, int64_t& width) {
  HostArray array = read_hdf5_array(path, "features");
  if (array.shape.size() != 2 || array.shape[0] < 1 || array.shape[1] < 1)
    throw BadInput(path + ": features must be [N,D] with N and D at least 1, got " + to_string(array.shape));
  if (width && array.shape[1] != width)
    throw BadInput(path + ": features have width " + std::to_string(array.shape[1]) + ", other slides " +
                   std::to_string(width));
  for (float value : array.values)
    if (!std::isfinite(value)) throw BadInput(path + ": features hold a value that is not finite");
  width = array.shape[1];
  return {slide, 0, array.shape[0], std::move(array.values)};
}

Bag read_bag(const std::string& directory, const std::string& slide, int64_t& width) {
  return read_bag_file((std::filesystem::path(directory) / (slide + ".h5")).string(), slide, width);
}

// A layer of the head: an op, the names of what it reads ("features", "count", "label" or an
// earlier stage), and once allocated the device tensors it reads, owns and writes.
struct Stage {
  std::string name;
  std::unique_ptr<Op> op;
  std::vector<std::string> input_names;
  Shape shape;
  std::vector<TensorSpec> specs;
  std::vector<const Tensor*> inputs, input_grads;
  std::vector<std::unique_ptr<Tensor>> tensors, grads;
  std::unique_ptr<Tensor> output, output_grad;

  OpTensors bindings(bool backward, const Tensor& step) const {
    OpTensors t;
    t.inputs = inputs;
    if (backward) {
      t.input_grads = input_grads;
      t.accumulate_input_grads.assign(inputs.size(), false);  // every tensor has one consumer
    }
    t.output = output.get();
    t.output_grad = backward ? output_grad.get() : nullptr;
    for (size_t s = 0; s < tensors.size(); ++s) {
      t.tensors.push_back(tensors[s].get());
      t.grads.push_back(grads[s].get());
    }
    t.step = &step;
    return t;
  }
};

uint32_t name_seed(uint32_t seed, const std::string& name) {
  return seed ^ static_cast<uint32_t>(std::hash<std::string>{}(name) & 0xffffffffu);
}

// The head's graph is built from shapes alone, so that it is planned before anything is on the
// device, then allocated.
class Head {
 public:
  // Bags of up to `rows` instances of `width` features. `instance_logits` (a mean head's tile
  // scores): the classifier reads every instance instead of their mean, and there is no loss.
  Head(const std::string& kind, int64_t rows, int64_t width, int64_t hidden, int64_t classes,
       bool instance_logits = false)
      : rows_(rows), width_(width) {
    if (instance_logits) {
      add("classifier", std::make_unique<Linear>(classes, true), {"features"});
      return;
    }
    if (kind == "attention") {
      add("attention_V", std::make_unique<Linear>(hidden, true), {"features"});
      add("attention_U", std::make_unique<Linear>(hidden, true), {"features"});
      add("attention_gate", std::make_unique<AttentionGate>(), {"attention_V", "attention_U"});
      add("attention_w", std::make_unique<Linear>(1, true), {"attention_gate"});
      add("pool", std::make_unique<AttentionPool>(), {"attention_w", "features", "count"});
    } else {
      add("pool", std::make_unique<InstanceMean>(), {"features", "count"});
    }
    add("classifier", std::make_unique<Linear>(classes, true), {"pool"});
    add("loss", std::make_unique<SoftmaxCrossEntropy>(), {"classifier", "label"});
  }

  // Device bytes of allocate() and of the optimizer's state, in the patch trainer's categories.
  MemoryPlan plan(const vk::Allocator& allocator, const Optimizer& optimizer) const {
    MemoryPlan plan;
    auto add_bytes = [&](const char* category, const Shape& shape, DType dtype) {
      plan.bytes[category] += allocator.footprint(static_cast<uint64_t>(element_count(shape)) * element_size(dtype));
    };
    // The staged bag (features, count, label), then the step count.
    add_bytes("activations", {rows_, width_}, DType::f32);
    add_bytes("activations", {1}, DType::u32);
    add_bytes("activations", {1}, DType::u32);
    add_bytes("optimizer state", {2}, DType::u32);
    for (auto& stage : stages_) {
      for (auto& spec : stage->specs) {
        add_bytes(spec.role == TensorRole::saved ? "activations" : "parameters", spec.shape, spec.dtype);
        if (spec.role != TensorRole::parameter) continue;
        add_bytes("gradients", spec.shape, DType::f32);
        for (auto& state : optimizer.state(spec)) add_bytes("optimizer state", state.shape, state.dtype);
      }
      add_bytes("activations", stage->shape, DType::f32);
      add_bytes("activation gradients", stage->shape, DType::f32);
    }
    return plan;
  }

  void allocate(vk::Context& context) {
    context_ = &context;
    features_ = std::make_unique<Tensor>(context, "features", Shape{rows_, width_});
    count_ = std::make_unique<Tensor>(context, "count", Shape{1}, DType::u32);
    label_ = std::make_unique<Tensor>(context, "label", Shape{1}, DType::u32);
    step_ = std::make_unique<Tensor>(context, "step", Shape{2}, DType::u32);
    // Each name's tensor and gradient; the inputs have no gradient.
    std::map<std::string, std::pair<const Tensor*, const Tensor*>> produced{
        {"features", {features_.get(), nullptr}}, {"count", {count_.get(), nullptr}}, {"label", {label_.get(), nullptr}}};
    for (auto& stage : stages_) {
      for (auto& input : stage->input_names) {
        stage->inputs.push_back(produced.at(input).first);
        stage->input_grads.push_back(produced.at(input).second);
      }
      for (auto& spec : stage->specs) {
        stage->tensors.push_back(
            std::make_unique<Tensor>(context, stage->name + "." + spec.name, spec.shape, spec.dtype));
        stage->grads.push_back(spec.role == TensorRole::parameter
                                   ? std::make_unique<Tensor>(context, stage->name + "." + spec.name + ".grad", spec.shape)
                                   : nullptr);
      }
      stage->output = std::make_unique<Tensor>(context, stage->name, stage->shape);
      stage->output_grad = std::make_unique<Tensor>(context, stage->name + ".grad", stage->shape);
      produced[stage->name] = {stage->output.get(), stage->output_grad.get()};
    }
  }

  // Parameters (and the loss's class weights) by name, as saved in checkpoints.
  std::vector<std::pair<std::string, Stage*>> stages() {
    std::vector<std::pair<std::string, Stage*>> all;
    for (auto& stage : stages_) all.emplace_back(stage->name, stage.get());
    return all;
  }
  Stage& find(const std::string& name) {
    for (auto& stage : stages_)
      if (stage->name == name) return *stage;
    throw std::logic_error("the head has no stage " + name);
  }
  Stage& loss() { return find("loss"); }
  Stage& classifier() { return find("classifier"); }
  Tensor& step() { return *step_; }

  // Parameter and state tensors by checkpoint name ("classifier.weight").
  std::map<std::string, Tensor*> saved_params() {
    std::map<std::string, Tensor*> tensors;
    for (auto& stage : stages_)
      for (size_t s = 0; s < stage->specs.size(); ++s)
        if (stage->specs[s].role != TensorRole::saved)
          tensors[stage->name + "." + stage->specs[s].name] = stage->tensors[s].get();
    return tensors;
  }

  void record_forward(vk::Recorder& recorder) {
    for (auto& stage : stages_) stage->op->forward(recorder, context_->kernels(), stage->bindings(false, *step_));
  }
  void record_backward(vk::Recorder& recorder) {
    for (size_t s = stages_.size(); s-- > 0;)
      stages_[s]->op->backward(recorder, context_->kernels(), stages_[s]->bindings(true, *step_));
  }

  // Stages one bag on the device; rows past its instances keep what they held, which the
  // pooling ops never read.
  void stage(const Bag& bag) {
    features_->upload(bag.features.data(), bag.features.size() * sizeof(float));
    auto count = static_cast<uint32_t>(bag.instances);
    count_->upload(&count, sizeof count);
    label_->upload(&bag.label, sizeof bag.label);
  }

 private:
  void add(const std::string& name, std::unique_ptr<Op> op, std::vector<std::string> input_names) {
    auto stage = std::make_unique<Stage>();
    stage->name = name;
    std::vector<Shape> shapes;
    for (auto& input : input_names) shapes.push_back(shape_of(input));
    stage->shape = op->infer(shapes);
    stage->op = std::move(op);
    stage->input_names = std::move(input_names);
    stage->specs = stage->op->tensors();
    stages_.push_back(std::move(stage));
  }

  Shape shape_of(const std::string& name) const {
    if (name == "features") return {rows_, width_};
    if (name == "count" || name == "label") return {1};
    for (auto& stage : stages_)
      if (stage->name == name) return stage->shape;
    throw std::logic_error("the head has no stage " + name);
  }

  int64_t rows_, width_;
  vk::Context* context_ = nullptr;
  std::unique_ptr<Tensor> features_, count_, label_, step_;
  std::vector<std::unique_ptr<Stage>> stages_;
};

struct EpochMetrics {
  double loss = 0, accuracy = 0;
};

class MilRun {
 public:
  MilRun(vk::Context& context, const TrainOptions& options, const MilOptions& mil)
      : context_(context), options_(options), mil_(mil) {
    load_bags();
    split();
    int64_t rows = 0;
    for (auto& bag : bags_) rows = std::max(rows, bag.instances);
    head_ = std::make_unique<Head>(mil.head, rows, width_, mil.attention_hidden, static_cast<int64_t>(classes_.size()));
    optimizer_ = Optimizer::make(options.optimizer);
  }

  MemoryPlan plan() const { return head_->plan(context_.allocator(), *optimizer_); }

  // Puts the head on the device, from the seed or the checkpoint, and records its programs.
  void start() {
    head_->allocate(context_);
    initialise();
    record();
  }

  void run(const TrainReporting& reporting) {
    nlohmann::json last;
    std::unique_ptr<Progress> progress;
    if (reporting.progress)
      progress = std::make_unique<Progress>("train", static_cast<uint64_t>(options_.epochs - first_epoch_));
    for (int epoch = first_epoch_; epoch < options_.epochs; ++epoch) {
      std::vector<size_t> order = train_;
      std::shuffle(order.begin(), order.end(), std::mt19937(options_.seed + static_cast<uint32_t>(epoch)));
      EpochMetrics train = pass(order, *train_program_);
      if (!std::isfinite(train.loss))
        throw Diverged("training diverged: the loss is not finite in epoch " + std::to_string(epoch + 1) +
                       " (try a lower --lr)");
      EpochMetrics val = pass(val_, *eval_program_);
      bool validated = !val_.empty();
      last = {{"event", "epoch"},
              {"epoch", epoch + 1},
              {"head", mil_.head},
              {"train_slides", train_.size()},
              {"val_slides", val_.size()},
              {"train_loss", train.loss},
              {"train_accuracy", train.accuracy},
              {"val_loss", validated ? nlohmann::json(val.loss) : nlohmann::json()},
              {"val_accuracy", validated ? nlohmann::json(val.accuracy) : nlohmann::json()},
              {"peak_device_bytes", context_.allocator().stats().peak_bytes}};
      if (progress) {
        progress->update(static_cast<uint64_t>(epoch + 1 - first_epoch_));
        progress->event(last);
      }
      if (reporting.protocol)
        reporting.protocol({{"type", "intermediate"}, {"step", epoch + 1}, {"value", validated ? val.loss : train.loss}});
      check_finite_state(download_tensors(head_->saved_params()), download_tensors(saved_train()), epoch + 1);
      if (!options_.checkpoint.empty()) save(epoch + 1, last);
    }
    if (progress) progress->finish();
    if (reporting.protocol && last.is_object())
      reporting.protocol({{"type", "final"},
                          {"value", last["val_loss"].is_number() ? last["val_loss"] : last["train_loss"]},
                          {"metrics", last},
                          {"peak_device_bytes", context_.allocator().stats().peak_bytes},
                          {"device", context_.info().name}});
  }

 private:
  void load_bags() {
    auto rows = read_labels(mil_.labels);
    for (auto& [slide, label] : rows) classes_.push_back(label);
    std::sort(classes_.begin(), classes_.end());
    classes_.erase(std::unique(classes_.begin(), classes_.end()), classes_.end());
    if (classes_.size() < 2) throw BadInput(mil_.labels + ": needs at least two distinct labels");
    for (auto& [slide, label] : rows) {
      Bag bag = read_bag(mil_.features, slide, width_);
      bag.label = static_cast<uint32_t>(std::lower_bound(classes_.begin(), classes_.end(), label) - classes_.begin());
      bags_.push_back(std::move(bag));
    }
  }

  // Held-out slides drawn per class, so that a small study keeps every class on both sides.
  void split() {
    std::mt19937 generator(options_.seed);
    for (uint32_t c = 0; c < classes_.size(); ++c) {
      std::vector<size_t> members;
      for (size_t b = 0; b < bags_.size(); ++b)
        if (bags_[b].label == c) members.push_back(b);
      std::shuffle(members.begin(), members.end(), generator);
      auto held = static_cast<size_t>(std::lround(options_.val_fraction * static_cast<double>(members.size())));
      held = std::min(held, members.size() - 1);
      val_.insert(val_.end(), members.begin(), members.begin() + static_cast<std::ptrdiff_t>(held));
      train_.insert(train_.end(), members.begin() + static_cast<std::ptrdiff_t>(held), members.end());
    }
    std::sort(val_.begin(), val_.end());
  }

  nlohmann::json description() const {
    return {{"head", mil_.head}, {"features", width_}, {"attention_hidden", mil_.attention_hidden},
            {"classes", classes_}};
  }

  void initialise() {
    for (auto& [name, stage] : head_->stages())
      for (size_t s = 0; s < stage->specs.size(); ++s) {
        const TensorSpec& spec = stage->specs[s];
        std::vector<float> values(static_cast<size_t>(element_count(spec.shape)), 0.0f);
        if (spec.init.kind == Init::uniform) {
          std::mt19937 generator(name_seed(options_.seed, name + "." + spec.name));
          std::uniform_real_distribution<float> distribution(-spec.init.scale, spec.init.scale);
          for (auto& v : values) v = distribution(generator);
        } else if (spec.init.kind == Init::ones) {
          std::fill(values.begin(), values.end(), 1.0f);
        }
        if (spec.name == "class_weight" && !options_.class_weights.empty()) {
          if (options_.class_weights.size() != values.size())
            throw UsageError("--class-weights has " + std::to_string(options_.class_weights.size()) +
                             " values; the labels have " + std::to_string(values.size()) + " classes");
          values = options_.class_weights;
        }
        stage->tensors[s]->upload(values);
        if (stage->grads[s]) {
          stage->grads[s]->upload(std::vector<float>(values.size(), 0.0f));
          for (auto& state_spec : optimizer_->state(spec)) {
            auto state = std::make_unique<Tensor>(context_, name + "." + spec.name + "." + state_spec.name,
                                                  state_spec.shape, state_spec.dtype);
            state->upload(std::vector<float>(static_cast<size_t>(state->count()), 0.0f));
            optimizer_states_[stage->tensors[s].get()].push_back(std::move(state));
          }
        }
      }
    head_->loss().output_grad->upload(std::vector<float>{1.0f});
    uint32_t step[2] = {0, 0};
    head_->step().upload(step, sizeof step);
    if (options_.resume && std::filesystem::exists(options_.checkpoint)) restore();
  }

  void record() {
    train_program_ = std::make_unique<vk::Program>(context_);
    {
      vk::Recorder recorder(context_, *train_program_);
      head_->record_forward(recorder);
      head_->record_backward(recorder);
      for (auto& [parameter, grad] : parameters()) {
        std::vector<const Tensor*> states;
        for (auto& state : optimizer_states_[parameter]) states.push_back(state.get());
        optimizer_->record_update(recorder, context_.kernels(), *parameter, *grad, states, head_->step());
      }
      Optimizer::record_step_advance(recorder, context_.kernels(), head_->step());
      recorder.finish();
    }
    eval_program_ = std::make_unique<vk::Program>(context_);
    vk::Recorder recorder(context_, *eval_program_);
    head_->record_forward(recorder);
    recorder.finish();
  }

  std::vector<std::pair<Tensor*, Tensor*>> parameters() {
    std::vector<std::pair<Tensor*, Tensor*>> all;
    for (auto& [name, stage] : head_->stages())
      for (size_t s = 0; s < stage->tensors.size(); ++s)
        if (stage->grads[s]) all.emplace_back(stage->tensors[s].get(), stage->grads[s].get());
    return all;
  }

  // One program run per slide: the mean loss and the accuracy over `slides`.
  EpochMetrics pass(const std::vector<size_t>& slides, vk::Program& program) {
    EpochMetrics metrics;
    for (size_t b : slides) {
      head_->stage(bags_[b]);
      program.run();
      metrics.loss += head_->loss().output->download()[0];
      auto logits = head_->classifier().output->download();
      auto predicted = static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      metrics.accuracy += predicted == bags_[b].label ? 1 : 0;
    }
    if (!slides.empty()) {
      metrics.loss /= static_cast<double>(slides.size());
      metrics.accuracy /= static_cast<double>(slides.size());
    }
    return metrics;
  }

  std::map<std::string, Tensor*> saved_train() {
    std::map<std::string, Tensor*> tensors{{"step", &head_->step()}};
    for (auto& [parameter, states] : optimizer_states_)
      for (auto& state : states) tensors["optimizer/" + state->name()] = state.get();
    return tensors;
  }

  void save(int epoch, const nlohmann::json& metrics) {
    nlohmann::json progress = run_settings(options_);
    progress.update({{"epoch", epoch}, {"metrics", metrics}});
    Checkpoint checkpoint{description(), download_tensors(head_->saved_params()), download_tensors(saved_train()),
                          progress};
    write_checkpoint(options_.checkpoint, checkpoint);
  }

  void restore() {
    Checkpoint checkpoint = read_checkpoint(options_.checkpoint);
    if (checkpoint.model != description())
      throw BadInput(options_.checkpoint + ": holds a head " + checkpoint.model.dump() + ", not " +
                     description().dump());
    load_tensors(checkpoint.params, head_->saved_params(), options_.checkpoint, "params");
    load_tensors(checkpoint.train, saved_train(), options_.checkpoint, "train");
    if (checkpoint.progress.is_object()) first_epoch_ = checkpoint.progress.value("epoch", 0);
  }

  vk::Context& context_;
  const TrainOptions& options_;
  const MilOptions& mil_;
  std::vector<std::string> classes_;
  std::vector<Bag> bags_;
  int64_t width_ = 0;
  std::vector<size_t> train_, val_;
  std::unique_ptr<Head> head_;
  std::unique_ptr<Optimizer> optimizer_;
  std::map<const Tensor*, std::vector<std::unique_ptr<Tensor>>> optimizer_states_;
  std::unique_ptr<vk::Program> train_program_, eval_program_;
  int first_epoch_ = 0;
};

// The head a checkpoint of train_mil describes; throws BadInput naming the file otherwise.
struct HeadDescription {
  std::string kind;
  int64_t width = 0, hidden = 0, classes = 0;
};

HeadDescription describe_head(const Checkpoint& checkpoint, const std::string& path) {
  const nlohmann::json& model = checkpoint.model;
  auto positive = [&](const char* key) {
    return model.contains(key) && model[key].is_number_integer() && model[key].get<int64_t>() > 0;
  };
  if (!model.is_object() || !model.contains("head") || !model["head"].is_string() || !positive("features") ||
      !positive("attention_hidden") || !model.contains("classes") || !model["classes"].is_array() ||
      model["classes"].size() < 2)
    throw BadInput(path + ": not a slide-level head (tessera train --features): its model is " + model.dump());
  HeadDescription head{model["head"].get<std::string>(), model["features"].get<int64_t>(),
                       model["attention_hidden"].get<int64_t>(), static_cast<int64_t>(model["classes"].size())};
  if (head.kind != "mean" && head.kind != "attention")
    throw BadInput(path + ": unknown head '" + head.kind + "' (mean or attention)");
  return head;
}

void check_mil_flags(const TrainOptions& options, const MilOptions& mil) {
  if (mil.head != "mean" && mil.head != "attention") throw UsageError("--head must be mean or attention");
  if (options.epochs < 1) throw UsageError("--epochs must be at least 1");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) throw UsageError("--val-fraction must be in [0, 1)");
  if (options.resume && options.checkpoint.empty()) throw UsageError("--resume needs --checkpoint PATH");
  if (mil.attention_hidden < 1) throw UsageError("--attention-hidden must be at least 1");
}

}  // namespace

std::vector<float> tile_scores(vk::Context& context, const std::string& features_path,
                               const std::string& checkpoint_path) {
  Checkpoint checkpoint = read_checkpoint(checkpoint_path);
  HeadDescription description = describe_head(checkpoint, checkpoint_path);
  int64_t width = 0;
  Bag bag = read_bag_file(features_path, "", width);
  if (width != description.width)
    throw BadInput(features_path + ": features have width " + std::to_string(width) + "; the head in " +
                   checkpoint_path + " takes " + std::to_string(description.width));
  bool mean = description.kind == "mean";
  Head head(description.kind, bag.instances, width, description.hidden, description.classes, mean);
  head.allocate(context);
  load_tensors(checkpoint.params, head.saved_params(), checkpoint_path, "params");
  head.stage(bag);
  vk::Program program(context);
  {
    vk::Recorder recorder(context, program);
    head.record_forward(recorder);
    recorder.finish();
  }
  program.run();
  std::vector<float> scores(static_cast<size_t>(bag.instances));
  if (mean) {
    // Softmax of each instance's logits on the host: C numbers a row, for the last class.
    auto logits = head.classifier().output->download();
    auto classes = static_cast<size_t>(description.classes);
    for (size_t n = 0; n < scores.size(); ++n) {
      const float* row = logits.data() + n * classes;
      float top = *std::max_element(row, row + classes);
      double sum = 0;
      for (size_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c] - top));
      scores[n] = static_cast<float>(std::exp(static_cast<double>(row[classes - 1] - top)) / sum);
    }
    return scores;
  }
  // The weights a_n taken on a log scale: their logits s_n (log a_n up to a constant), since
  // a softmax over many tiles leaves all but the top few near 0. Min-max rescaled, so that
  // maps of slides of any size share one colour scale.
  auto logits = head.find("attention_w").output->download();
  auto [low, high] = std::minmax_element(logits.begin(), logits.end());
  float range = *high - *low;
  for (size_t n = 0; n < scores.size(); ++n) scores[n] = range > 0 ? (logits[n] - *low) / range : 0.0f;
  return scores;
}

MemoryPlan plan_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil) {
  check_mil_flags(options, mil);
  return MilRun(context, options, mil).plan();
}

void train_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil,
               const TrainReporting& reporting) {
  check_mil_flags(options, mil);
  MilRun run(context, options, mil);
  check_plan_fits(context, run.plan(), "lower --attention-hidden, or raise --device-memory-limit");
  run.start();
  run.run(reporting);
}

}  // namespace tessera
