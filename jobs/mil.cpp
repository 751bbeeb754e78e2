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
#include "jobs/classification_metrics.h"
#include "jobs/mil_bags.h"

namespace tessera {

namespace {

// The slides, their split, and the head as a job for the shared training loop.
class MilJob {
 public:
  MilJob(const TrainOptions& options, const MilOptions& mil) : options_(options), mil_(mil) {
    // One bag a step: the patch flags --batch and --accumulate do not apply.
    options_.batch = 1;
    options_.accumulate = 1;
    options_.job_settings = mil_settings(mil);
    cohort_ = read_cohort(mil_, options_.fp16);
    split();
  }

  const TrainOptions& options() const { return options_; }
  const Cohort& cohort() const { return cohort_; }

  TrainingJob job(vk::Context& context) const {
    TrainingJob job = head_job(cohort_, mil_, options_, recomputes_attention(context, cohort_, mil_, options_));
    if (options_.resume && std::filesystem::exists(options_.checkpoint)) {
      job.start = read_checkpoint(options_.checkpoint);
      job.start_path = options_.checkpoint;
      if (job.start->model != job.model)
        throw BadInput(options_.checkpoint + ": holds a head " + job.start->model.dump() + ", not " +
                       job.model.dump());
    }
    job.report = {{"head", mil_.head}, {"train_slides", train_.size()}, {"val_slides", val_.size()},
                  {"split", split_report_}};
    return job;
  }

  BagFeed train_feed() const { return BagFeed(cohort_.bags, train_, true, options_.seed); }
  BagFeed val_feed() const { return BagFeed(cohort_.bags, val_, false, options_.seed); }

 private:
  // Held-out slides drawn per class, as many in all as --val-fraction of the slides comes
  // nearest to, shared among the classes by their sizes (largest remainders), each class keeping
  // a slide for training. A fraction that holds out no slide is refused, one that leaves
  // validation without a class is said.
  void split() {
    std::mt19937 generator(options_.seed);
    std::vector<std::vector<size_t>> members(cohort_.classes.size());
    for (size_t b = 0; b < cohort_.bags.size(); ++b) members[cohort_.bags[b].label].push_back(b);
    for (auto& slides : members) std::shuffle(slides.begin(), slides.end(), generator);
    double slides = static_cast<double>(cohort_.bags.size());
    auto wanted = static_cast<size_t>(std::llround(options_.val_fraction * slides));
    std::vector<size_t> held(cohort_.classes.size());
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
    std::vector<uint64_t> train_classes(cohort_.classes.size()), val_classes(cohort_.classes.size());
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
      throw UsageError(asked + " of " + std::to_string(cohort_.bags.size()) + " slides holds out none: use --val-fraction 0 " +
                       "to train without validation, or at least " + format_number(0.5 / slides) +
                       " (one slide), " + format_number(static_cast<double>(cohort_.classes.size()) / slides) + " for one of each class");
    nlohmann::json warnings = nlohmann::json::array();
    if (raised)
      warnings.push_back(asked + " (the default) of " + std::to_string(cohort_.bags.size()) + " slides would leave " +
                         std::to_string(raised) + " class(es) out of validation: it holds out one slide of each class "
                         "instead, " + std::to_string(val_.size()) + " in all (give --val-fraction to choose)");
    size_t val_kinds = static_cast<size_t>(std::count_if(val_classes.begin(), val_classes.end(), [](uint64_t n) { return n > 0; }));
    if (!val_.empty() && val_kinds < cohort_.classes.size())
      warnings.push_back("validation holds slides of " + std::to_string(val_kinds) + " of the " +
                         std::to_string(cohort_.classes.size()) + " classes" +
                         (val_kinds == 1 ? ": its AUC is undefined and its accuracy that of one class" : ""));
    split_report_ = {{"val_fraction", options_.val_fraction},
                     {"held_out_fraction", static_cast<double>(val_.size()) / slides},
                     {"classes", cohort_.classes},
                     {"train", {{"slides", train_.size()}, {"per_class", train_classes}}},
                     {"validation", {{"slides", val_.size()}, {"per_class", val_classes}}},
                     {"warnings", warnings}};
  }

 public:
  // The split before any work: what was held out, and each warning on a line of its own.
  void report_split() const {
    nlohmann::json record = {{"event", "split"}};
    record.update(split_report_);
    for (size_t b : val_) record["held_out_slides"].push_back(cohort_.bags[b].slide);
    report("train", record);
    for (auto& warning : split_report_["warnings"]) report("train", {{"warning", warning}});
  }

 private:
  TrainOptions options_;
  const MilOptions& mil_;
  Cohort cohort_;
  std::vector<size_t> train_, val_;
  nlohmann::json split_report_;
};

// Each value's rank among them (1 the smallest, ties given their mean rank) over their count, as
// CLAM's create_heatmaps.py to_percentiles (scipy's rankdata "average" / n) scales attention.
std::vector<float> percentile_ranks(const std::vector<float>& values) {
  std::vector<size_t> order(values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<float> ranks(values.size());
  for (size_t first = 0; first < order.size();) {
    size_t last = first;
    while (last + 1 < order.size() && values[order[last + 1]] == values[order[first]]) ++last;
    double mean_rank = (static_cast<double>(first + 1) + static_cast<double>(last + 1)) / 2;
    for (size_t i = first; i <= last; ++i)
      ranks[order[i]] = static_cast<float>(mean_rank / static_cast<double>(values.size()));
    first = last + 1;
  }
  return ranks;
}

bool is_mil_head(const std::string& name) {
  const auto& heads = mil_heads();
  return std::find(heads.begin(), heads.end(), name) != heads.end();
}

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
  if (!is_mil_head(head.kind)) throw BadInput(path + ": unknown head '" + head.kind + "' (" + mil_head_list() + ")");
  return head;
}

void check_mil_flags(const TrainOptions& options, const MilOptions& mil) {
  if (!is_mil_head(mil.head)) throw UsageError("--head: unknown head '" + mil.head + "': the heads are " + mil_head_list());
  if (options.epochs < 1) throw UsageError("--epochs must be at least 1");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) throw UsageError("--val-fraction must be in [0, 1)");
  if (options.resume && options.checkpoint.empty()) throw UsageError("--resume needs --checkpoint PATH");
  if (mil.attention_hidden < 0) throw UsageError("--attention-hidden must be at least 1");
  if (mil.head == "transmil" && attention_hidden(mil) % 8 != 0)
    throw UsageError("--attention-hidden " + std::to_string(mil.attention_hidden) +
                     ": transmil's width splits into 8 heads and half as many landmarks, so it must be a multiple of 8");
  check_clam_flags(mil);
}

}  // namespace

const std::vector<std::string>& mil_heads() {
  static const std::vector<std::string> heads{"attention", "mean", "max", "dsmil", "clam-sb", "clam-mb", "transmil"};
  return heads;
}

void check_clam_flags(const MilOptions& mil) {
  if (!is_clam_head(mil.head)) {
    const char* flag = mil.clam.k_sample     ? "--k-sample"
                       : mil.clam.bag_weight ? "--bag-weight"
                       : mil.clam.subtyping  ? "--subtyping"
                                             : nullptr;
    if (flag) throw UsageError(std::string(flag) + " applies to the clam-sb and clam-mb heads only, not --head " + mil.head);
  }
  if (mil.clam.k_sample && *mil.clam.k_sample < 1) throw UsageError("--k-sample must be at least 1");
  if (mil.clam.bag_weight && !(*mil.clam.bag_weight >= 0 && *mil.clam.bag_weight <= 1))
    throw UsageError("--bag-weight must be in [0, 1]");
}

int attention_hidden(const MilOptions& mil) {
  if (mil.attention_hidden > 0) return mil.attention_hidden;
  if (mil.head == "transmil") return 512;    // TransMIL's width
  return is_clam_head(mil.head) ? 256 : 128;  // CLAM's size_dict "small": [D, 512, 256]
}

std::string mil_head_list() {
  const auto& heads = mil_heads();
  std::string list;
  for (size_t i = 0; i < heads.size(); ++i)
    list += (i == 0 ? "" : i + 1 == heads.size() ? " or " : ", ") + heads[i];
  return list;
}

std::vector<float> tile_scores(vk::Context& context, const std::string& features_path,
                               const std::string& checkpoint_path) {
  Checkpoint checkpoint = read_checkpoint(checkpoint_path);
  HeadDescription description = describe_head(checkpoint, checkpoint_path);
  int64_t width = 0;
  Bag bag = read_bag_file(features_path, "", width, false);
  if (width != description.width)
    throw BadInput(features_path + ": features have width " + std::to_string(width) + "; the head in " +
                   checkpoint_path + " takes " + std::to_string(description.width));
  // The head's classifier on each instance alone: an attention, mean or max pool of one instance
  // is that instance, so each head gives the probability it would give a bag of this one tile;
  // dsmil's instance classifier, the per-instance scores its critical instance is chosen by.
  nlohmann::json graph = head_graph(description.kind, description.hidden, description.classes, HeadUse::tile_scores);
  InferenceOptions setup;
  setup.inputs = {{"features", {bag.instances, width}}};
  bool counted = description.kind == "transmil";  // its graph reads the bag's count, as in training
  if (counted) setup.inputs.push_back({"count", {1}, DType::u32});
  setup.input_memory = vk::MemoryUsage::device;
  setup.advice = "the slide's tile count and the head's width set it";
  Inference head(context, {.graph = std::move(graph), .checkpoint = std::move(checkpoint), .source = checkpoint_path},
                 setup);
  head.input("features").upload(bag.features);
  if (counted) {
    auto count = static_cast<uint32_t>(bag.instances);
    head.input("count").upload(&count, sizeof count);
  }
  head.run();
  auto logits = head.output().download();
  std::vector<float> scores(static_cast<size_t>(bag.instances));
  if (is_clam_head(description.kind) || description.kind == "transmil") {
    // The attention of each tile (clam-mb: the last class's column; transmil: from the class token
    // in its second layer), as its percentile in the slide.
    size_t columns = description.kind == "clam-mb" ? static_cast<size_t>(description.classes) : 1;
    for (size_t n = 0; n < scores.size(); ++n) scores[n] = logits[n * columns + columns - 1];
    return percentile_ranks(scores);
  }
  // Softmax of each instance's logits on the host: C numbers a row, for the last class.
  auto classes = static_cast<size_t>(description.classes);
  for (size_t n = 0; n < scores.size(); ++n)
    scores[n] = static_cast<float>(softmax(logits.data() + n * classes, classes).back());
  return scores;
}

nlohmann::json mil_settings(const MilOptions& mil) {
  std::error_code error;
  nlohmann::json settings = {{"features", std::filesystem::weakly_canonical(mil.features, error).string()},
                              {"labels", std::filesystem::weakly_canonical(mil.labels, error).string()},
                              {"head", mil.head},
                              {"attention_hidden", attention_hidden(mil)}};
  // As given (null: the default), so that a resumed run takes what the first run took.
  auto given = [](const auto& value) { return value ? nlohmann::json(*value) : nlohmann::json(); };
  if (is_clam_head(mil.head))
    settings.update({{"k_sample", given(mil.clam.k_sample)},
                     {"bag_weight", given(mil.clam.bag_weight)},
                     {"subtyping", given(mil.clam.subtyping)}});
  return settings;
}

MemoryPlan plan_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil) {
  check_mil_flags(options, mil);
  MilJob job(options, mil);
  check_bags_within_kernel_loops(context.info(), job.cohort());
  return TrainingLoop(context, loop_settings(job.options()), job.job(context)).plan();
}

void train_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil,
               const TrainReporting& reporting) {
  check_mil_flags(options, mil);
  MilJob job(options, mil);
  check_bags_within_kernel_loops(context.info(), job.cohort());
  if (reporting.progress) job.report_split();
  TrainingLoop loop(context, loop_settings(job.options()), job.job(context));
  BagFeed train_feed = job.train_feed(), val_feed = job.val_feed();
  loop.run(train_feed, val_feed, reporting);
}

}  // namespace tessera
