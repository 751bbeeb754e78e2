#include "jobs/mil.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "common/error.h"
#include "common/progress.h"
#include "common/units.h"
#include "compute/checkpoint.h"
#include "compute/inference.h"
#include "compute/tensor.h"
#include "jobs/slide_labels.h"

namespace tessera {

namespace {

struct Bag {
  std::string slide;
  uint32_t label = 0;
  int64_t instances = 0;
  std::vector<float> features;   // [instances, width]
  std::vector<uint16_t> halves;  // the same in fp16, in place of `features` for --precision fp16

  // Rounds the features to fp16 once, at load; a value past fp16's range is refused, not made infinite.
  void to_fp16(const std::string& path) {
    for (float value : features)
      if (std::abs(value) > 65504.0f)
        throw BadInput(path + ": features hold " + std::to_string(value) +
                       ", beyond fp16's range (65504): train this head with --precision fp32");
    halves = to_half(features);
    features = {};
  }
  const void* staged_bytes() const {
    return halves.empty() ? static_cast<const void*>(features.data()) : halves.data();
  }
  size_t staged_size() const {
    return halves.empty() ? features.size() * sizeof(float) : halves.size() * sizeof(uint16_t);
  }
};

// One feature file as a bag; `width` is the other bags' D (0: none read yet), and becomes this one's.
// With `fp16` the bag holds its features rounded to fp16, as --precision fp16 stages them.
Bag read_bag_file(const std::string& path, const std::string& slide, int64_t& width, bool fp16) {
  HostArray array = read_hdf5_array(path, "features");
  if (array.shape.size() != 2 || array.shape[0] < 1 || array.shape[1] < 1)
    throw BadInput(path + ": features must be [N,D] with N and D at least 1, got " + to_string(array.shape));
  if (width && array.shape[1] != width)
    throw BadInput(path + ": features have width " + std::to_string(array.shape[1]) + ", other slides " +
                   std::to_string(width));
  for (float value : array.values)
    if (!std::isfinite(value)) throw BadInput(path + ": features hold a value that is not finite");
  width = array.shape[1];
  Bag bag{slide, 0, array.shape[0], std::move(array.values), {}};
  if (fp16) bag.to_fp16(path);
  return bag;
}

// The head as a graph over the staged bag ("features" [M,D], "count" [1]): the model that
// the shared loop trains and that tile_scores runs. `instance_logits` (a mean head's tile
// scores): the classifier reads every instance instead of their mean.
nlohmann::json head_graph(const std::string& kind, int64_t hidden, int64_t classes, bool instance_logits = false) {
  auto layer = [](const std::string& name, const std::string& type, std::vector<std::string> inputs,
                  nlohmann::json fields = nlohmann::json::object()) {
    fields["name"] = name;
    fields["type"] = type;
    fields["inputs"] = inputs;
    return fields;
  };
  nlohmann::json layers = nlohmann::json::array();
  if (instance_logits) {
    layers.push_back(layer("classifier", "linear", {"features"}, {{"out_features", classes}}));
    return {{"layers", layers}};
  }
  if (kind == "attention") {
    layers.push_back(layer("attention_V", "linear", {"features"}, {{"out_features", hidden}}));
    layers.push_back(layer("attention_U", "linear", {"features"}, {{"out_features", hidden}}));
    layers.push_back(layer("attention_gate", "attention_gate", {"attention_V", "attention_U"}));
    layers.push_back(layer("attention_w", "linear", {"attention_gate"}, {{"out_features", 1}}));
    layers.push_back(layer("pool", "attention_pool", {"attention_w", "features", "count"}));
  } else {
    layers.push_back(layer("pool", "instance_mean", {"features", "count"}));
  }
  layers.push_back(layer("classifier", "linear", {"pool"}, {{"out_features", classes}}));
  return {{"layers", layers}};
}

// Slides one at a time, each a batch of one bag padded to the largest bag's rows; rows past
// its instances keep what they held, which the pooling ops never read.
class BagFeed : public Feed {
 public:
  BagFeed(const std::vector<Bag>& bags, std::vector<size_t> slides, bool shuffle, uint32_t seed)
      : bags_(bags), slides_(std::move(slides)), shuffle_(shuffle), seed_(seed) {}
  size_t batches_per_epoch() const override { return slides_.size(); }
  void start_epoch(uint32_t epoch) override {
    order_ = slides_;
    if (shuffle_) std::shuffle(order_.begin(), order_.end(), std::mt19937(seed_ + epoch));
    next_ = 0;
  }
  bool next(const std::map<std::string, const Tensor*>& staged) override {
    if (next_ == order_.size()) return false;
    const Bag& bag = bags_[order_[next_++]];
    std::memcpy(staged.at("features")->buffer().mapped(), bag.staged_bytes(), bag.staged_size());
    auto count = static_cast<uint32_t>(bag.instances), one = 1u;
    std::memcpy(staged.at("count")->buffer().mapped(), &count, 4);
    std::memcpy(staged.at("labels")->buffer().mapped(), &bag.label, 4);
    std::memcpy(staged.at("valid")->buffer().mapped(), &one, 4);
    return true;
  }

 private:
  const std::vector<Bag>& bags_;
  std::vector<size_t> slides_, order_;
  bool shuffle_;
  uint32_t seed_;
  size_t next_ = 0;
};

// The slides, their split, and the head as a job for the shared training loop.
class MilJob {
 public:
  MilJob(const TrainOptions& options, const MilOptions& mil) : options_(options), mil_(mil) {
    // One bag a step: the patch flags --batch and --accumulate do not apply.
    options_.batch = 1;
    options_.accumulate = 1;
    options_.job_settings = mil_settings(mil);
    load_bags();
    split();
  }

  const TrainOptions& options() const { return options_; }

  TrainingJob job() const {
    int64_t rows = 0;
    for (auto& bag : bags_) rows = std::max(rows, bag.instances);
    TrainingJob job;
    job.model = description();
    job.graph = head_graph(mil_.head, mil_.attention_hidden, static_cast<int64_t>(classes_.size()));
    job.staged = {{"features", {rows, width_}, options_.fp16 ? DType::f16 : DType::f32},
                  {"count", {1}, DType::u32},
                  {"labels", {1}, DType::u32},
                  {"valid", {1}, DType::u32}};
    if (options_.resume && std::filesystem::exists(options_.checkpoint)) {
      job.start = read_checkpoint(options_.checkpoint);
      job.start_path = options_.checkpoint;
      if (job.start->model != job.model)
        throw BadInput(options_.checkpoint + ": holds a head " + job.start->model.dump() + ", not " +
                       job.model.dump());
    }
    job.settings = run_settings(options_);
    job.report = {{"head", mil_.head}, {"train_slides", train_.size()}, {"val_slides", val_.size()},
                  {"split", split_report_}};
    job.advice = "lower --attention-hidden, or raise --device-memory-limit";
    return job;
  }

  BagFeed train_feed() const { return BagFeed(bags_, train_, true, options_.seed); }
  BagFeed val_feed() const { return BagFeed(bags_, val_, false, options_.seed); }

 private:
  void load_bags() {
    auto rows = read_slide_labels(mil_.labels, mil_.features);
    for (auto& row : rows) classes_.push_back(row.label);
    std::sort(classes_.begin(), classes_.end());
    classes_.erase(std::unique(classes_.begin(), classes_.end()), classes_.end());
    if (classes_.size() < 2) throw BadInput(mil_.labels + ": needs at least two distinct labels");
    for (auto& row : rows) {
      Bag bag = read_bag_file(row.path, row.slide, width_, options_.fp16);
      bag.label = static_cast<uint32_t>(std::lower_bound(classes_.begin(), classes_.end(), row.label) - classes_.begin());
      bags_.push_back(std::move(bag));
    }
  }

  // Held-out slides drawn per class, as many in all as --val-fraction of the slides comes
  // nearest to, shared among the classes by their sizes (largest remainders), each class keeping
  // a slide for training. A fraction that holds out no slide is refused, one that leaves
  // validation without a class is said.
  void split() {
    std::mt19937 generator(options_.seed);
    std::vector<std::vector<size_t>> members(classes_.size());
    for (size_t b = 0; b < bags_.size(); ++b) members[bags_[b].label].push_back(b);
    for (auto& slides : members) std::shuffle(slides.begin(), slides.end(), generator);
    double slides = static_cast<double>(bags_.size());
    auto wanted = static_cast<size_t>(std::llround(options_.val_fraction * slides));
    std::vector<size_t> held(classes_.size());
    std::vector<std::pair<double, size_t>> remainders;  // (-remainder, class): largest first
    size_t given = 0;
    for (size_t c = 0; c < members.size(); ++c) {
      double share = options_.val_fraction * static_cast<double>(members[c].size());
      held[c] = static_cast<size_t>(share);
      remainders.push_back({held[c] - share, c});
      given += held[c];
    }
    std::sort(remainders.begin(), remainders.end());
    for (size_t i = 0; given < wanted && i < remainders.size(); ++i, ++given) ++held[remainders[i].second];
    size_t raised = 0;
    if (options_.val_fraction_default && options_.val_fraction > 0)
      for (size_t c = 0; c < members.size(); ++c)
        if (held[c] == 0 && members[c].size() >= 2) {
          held[c] = 1;
          ++raised;
        }
    std::vector<uint64_t> train_classes(classes_.size()), val_classes(classes_.size());
    for (size_t c = 0; c < members.size(); ++c) {
      held[c] = std::min(held[c], members[c].size() - 1);
      val_.insert(val_.end(), members[c].begin(), members[c].begin() + static_cast<std::ptrdiff_t>(held[c]));
      train_.insert(train_.end(), members[c].begin() + static_cast<std::ptrdiff_t>(held[c]), members[c].end());
      val_classes[c] = held[c];
      train_classes[c] = members[c].size() - held[c];
    }
    std::sort(val_.begin(), val_.end());
    std::string asked = "--val-fraction " + format_number(options_.val_fraction);
    if (options_.val_fraction > 0 && val_.empty())
      throw UsageError(asked + " of " + std::to_string(bags_.size()) + " slides holds out none: use --val-fraction 0 " +
                       "to train without validation, or at least " + format_number(0.5 / slides) +
                       " (one slide), " + format_number(static_cast<double>(classes_.size()) / slides) + " for one of each class");
    nlohmann::json warnings = nlohmann::json::array();
    if (raised)
      warnings.push_back(asked + " (the default) of " + std::to_string(bags_.size()) + " slides would leave " +
                         std::to_string(raised) + " class(es) out of validation: it holds out one slide of each class "
                         "instead, " + std::to_string(val_.size()) + " in all (give --val-fraction to choose)");
    size_t val_kinds = static_cast<size_t>(std::count_if(val_classes.begin(), val_classes.end(), [](uint64_t n) { return n > 0; }));
    if (!val_.empty() && val_kinds < classes_.size())
      warnings.push_back("validation holds slides of " + std::to_string(val_kinds) + " of the " +
                         std::to_string(classes_.size()) + " classes" +
                         (val_kinds == 1 ? ": its AUC is undefined and its accuracy that of one class" : ""));
    split_report_ = {{"val_fraction", options_.val_fraction},
                     {"held_out_fraction", static_cast<double>(val_.size()) / slides},
                     {"classes", classes_},
                     {"train", {{"slides", train_.size()}, {"per_class", train_classes}}},
                     {"validation", {{"slides", val_.size()}, {"per_class", val_classes}}},
                     {"warnings", warnings}};
  }

 public:
  // The split before any work: what was held out, and each warning on a line of its own.
  void report_split() const {
    nlohmann::json record = {{"event", "split"}};
    record.update(split_report_);
    for (size_t b : val_) record["held_out_slides"].push_back(bags_[b].slide);
    report("train", record);
    for (auto& warning : split_report_["warnings"]) report("train", {{"warning", warning}});
  }

 private:
  nlohmann::json description() const {
    return {{"head", mil_.head}, {"features", width_}, {"attention_hidden", mil_.attention_hidden},
            {"classes", classes_}};
  }

  TrainOptions options_;
  const MilOptions& mil_;
  std::vector<std::string> classes_;
  std::vector<Bag> bags_;
  int64_t width_ = 0;
  std::vector<size_t> train_, val_;
  nlohmann::json split_report_;
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
  Bag bag = read_bag_file(features_path, "", width, false);
  if (width != description.width)
    throw BadInput(features_path + ": features have width " + std::to_string(width) + "; the head in " +
                   checkpoint_path + " takes " + std::to_string(description.width));
  // The head's classifier on each instance alone: an attention pool of one instance is that
  // instance, so either head gives the probability it would give a bag of this one tile.
  nlohmann::json graph = head_graph(description.kind, description.hidden, description.classes, true);
  InferenceOptions setup;
  setup.inputs = {{"features", {bag.instances, width}}};
  setup.input_memory = vk::MemoryUsage::device;
  setup.advice = "the slide's tile count and the head's width set it";
  Inference head(context, {std::move(graph), std::move(checkpoint), checkpoint_path}, setup);
  head.input("features").upload(bag.features);
  head.run();
  auto logits = head.output().download();
  std::vector<float> scores(static_cast<size_t>(bag.instances));
  // Softmax of each instance's logits on the host: C numbers a row, for the last class.
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

nlohmann::json mil_settings(const MilOptions& mil) {
  std::error_code error;
  return {{"features", std::filesystem::weakly_canonical(mil.features, error).string()},
          {"labels", std::filesystem::weakly_canonical(mil.labels, error).string()},
          {"head", mil.head},
          {"attention_hidden", mil.attention_hidden}};
}

MemoryPlan plan_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil) {
  check_mil_flags(options, mil);
  MilJob job(options, mil);
  return TrainingLoop(context, loop_settings(job.options()), job.job()).plan();
}

void train_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil,
               const TrainReporting& reporting) {
  check_mil_flags(options, mil);
  MilJob job(options, mil);
  if (reporting.progress) job.report_split();
  TrainingLoop loop(context, loop_settings(job.options()), job.job());
  BagFeed train_feed = job.train_feed(), val_feed = job.val_feed();
  loop.run(train_feed, val_feed, reporting);
}

}  // namespace tessera
