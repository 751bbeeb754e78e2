#include "jobs/mil_bags.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "common/error.h"
#include "compute/checkpoint.h"
#include "compute/feature_file.h"
#include "compute/tensor.h"

namespace tessera {

void Bag::to_fp16(const std::string& path) {
  for (float value : features)
    if (std::abs(value) > 65504.0f)
      throw BadInput(path + ": features hold " + std::to_string(value) +
                     ", beyond fp16's range (65504): train this head with --precision fp32");
  halves = to_half(features);
  features = {};
}

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

nlohmann::json head_graph(const std::string& kind, int64_t hidden, int64_t classes, bool instance_logits) {
  auto layer = [](const std::string& name, const std::string& type, std::vector<std::string> inputs,
                  nlohmann::json fields = nlohmann::json::object()) {
    fields["name"] = name;
    fields["type"] = type;
    fields["inputs"] = inputs;
    return fields;
  };
  nlohmann::json layers = nlohmann::json::array();
  if (instance_logits) {
    layers.push_back(layer(kind == "dsmil" ? "i_classifier.fc.0" : "classifier", "linear", {"features"},
                           {{"out_features", classes}}));
    return {{"layers", layers}};
  }
  if (kind == "dsmil") {
    // DSMIL (Li et al. 2021) as binli123/dsmil-wsi at 80465ed trains it: dsmil.py's MILNet of
    // FCLayer and BClassifier(nonlinear=True, passing_v=False), as train_tcga.py builds it, so
    // V is the features themselves; the layers named as its state_dict's. The bag classifier
    // fcc, Conv1d(C, C, kernel_size=D) over B [C, D], is a linear layer over B as one row: its
    // weight is PyTorch's [C, C, D] viewed as [C, C*D].
    layers.push_back(layer("i_classifier.fc.0", "linear", {"features"}, {{"out_features", classes}}));
    layers.push_back(layer("instance_max", "instance_max", {"i_classifier.fc.0", "count"}));
    layers.push_back(layer("b_classifier.q.0", "linear", {"features"}, {{"out_features", hidden}}));
    layers.push_back(layer("b_classifier.q.1", "relu", {"b_classifier.q.0"}));
    layers.push_back(layer("b_classifier.q.2", "linear", {"b_classifier.q.1"}, {{"out_features", hidden}}));
    layers.push_back(layer("b_classifier.q.3", "tanh", {"b_classifier.q.2"}));
    layers.push_back(layer("critical", "critical_instance_scores", {"b_classifier.q.3", "i_classifier.fc.0", "count"}));
    layers.push_back(layer("pool", "attention_pool", {"critical", "features", "count"}));
    layers.push_back(layer("b_classifier.fcc", "linear", {"pool"}, {{"out_features", classes}}));
    return {{"layers", layers}};
  }
  if (kind == "attention") {
    layers.push_back(layer("attention_V", "linear", {"features"}, {{"out_features", hidden}}));
    layers.push_back(layer("attention_U", "linear", {"features"}, {{"out_features", hidden}}));
    layers.push_back(layer("attention_gate", "attention_gate", {"attention_V", "attention_U"}));
    layers.push_back(layer("attention_w", "linear", {"attention_gate"}, {{"out_features", 1}}));
    layers.push_back(layer("pool", "attention_pool", {"attention_w", "features", "count"}));
  } else if (kind == "max") {
    layers.push_back(layer("pool", "instance_max", {"features", "count"}));
  } else {
    layers.push_back(layer("pool", "instance_mean", {"features", "count"}));
  }
  layers.push_back(layer("classifier", "linear", {"pool"}, {{"out_features", classes}}));
  return {{"layers", layers}};
}

Cohort read_cohort(const MilOptions& mil, bool fp16) {
  Cohort cohort;
  cohort.rows = read_slide_labels(mil.labels, mil.features);
  auto& classes = cohort.classes;
  for (auto& row : cohort.rows) classes.push_back(row.label);
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  if (classes.size() < 2) throw BadInput(mil.labels + ": needs at least two distinct labels");
  std::string encoder, encoder_file;  // the first encoder a file names, and that file
  for (auto& row : cohort.rows) {
    // Features of two encoders can share a width (uni and phikon-v2: 1024) yet mean nothing together.
    if (std::string named = feature_file_encoder(row.path); !named.empty()) {
      if (encoder.empty()) {
        encoder = named;
        encoder_file = row.path;
      } else if (named != encoder) {
        throw BadInput(row.path + ": features made by encoder '" + named + "', but " + encoder_file +
                       "'s by '" + encoder + "': a cohort's features come from one encoder");
      }
    }
    Bag bag = read_bag_file(row.path, row.slide, cohort.width, fp16);
    bag.label = static_cast<uint32_t>(std::lower_bound(classes.begin(), classes.end(), row.label) - classes.begin());
    cohort.bags.push_back(std::move(bag));
  }
  return cohort;
}

void set_head_losses(const std::string& kind, TrainingJob& job) {
  if (kind != "dsmil") return;
  // train_tcga.py: loss = 0.5 * bag loss + 0.5 * the loss of the max over instances of the
  // instance classifier's logits. Its criterion is BCEWithLogitsLoss over multi-label targets;
  // tessera's classes are single-label, so both terms are softmax cross-entropy.
  job.logits_loss_weight = 0.5f;
  job.extra_losses = {{"instance_max", 0.5f}};
}

TrainingJob head_job(const Cohort& cohort, const MilOptions& mil, const TrainOptions& options) {
  int64_t rows = 0;
  for (auto& bag : cohort.bags) rows = std::max(rows, bag.instances);
  TrainingJob job;
  job.model = {{"head", mil.head}, {"features", cohort.width}, {"attention_hidden", mil.attention_hidden},
               {"classes", cohort.classes}};
  job.graph = head_graph(mil.head, mil.attention_hidden, static_cast<int64_t>(cohort.classes.size()));
  job.staged = {{"features", {rows, cohort.width}, options.fp16 ? DType::f16 : DType::f32},
                {"count", {1}, DType::u32},
                {"labels", {1}, DType::u32},
                {"valid", {1}, DType::u32}};
  job.settings = run_settings(options);
  job.advice = "lower --attention-hidden, or raise --device-memory-limit";
  set_head_losses(mil.head, job);
  return job;
}

void BagFeed::start_epoch(uint32_t epoch) {
  order_ = slides_;
  if (shuffle_) std::shuffle(order_.begin(), order_.end(), std::mt19937(seed_ + epoch));
  next_ = 0;
}

bool BagFeed::next(const std::map<std::string, const Tensor*>& staged) {
  if (next_ == order_.size()) return false;
  const Bag& bag = bags_[order_[next_++]];
  std::memcpy(staged.at("features")->buffer().mapped(), bag.staged_bytes(), bag.staged_size());
  auto count = static_cast<uint32_t>(bag.instances), one = 1u;
  std::memcpy(staged.at("count")->buffer().mapped(), &count, 4);
  std::memcpy(staged.at("labels")->buffer().mapped(), &bag.label, 4);
  std::memcpy(staged.at("valid")->buffer().mapped(), &one, 4);
  return true;
}

}  // namespace tessera
