#include "jobs/mil_cross_validation.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "common/csv.h"
#include "common/error.h"
#include "common/output.h"
#include "common/progress.h"
#include "compute/inference.h"
#include "compute/tensor.h"
#include "jobs/case_folds.h"
#include "jobs/classification_metrics.h"
#include "jobs/mil_bags.h"

namespace tessera {

namespace {

using Probabilities = std::vector<std::vector<double>>;
const char* const metric_names[] = {"auc", "balanced_accuracy", "f1"};

// The held-out slides' class probabilities under the head trained on the other folds: the same
// graph run forward once a slide. fp16 bags (--precision fp16) are scored in fp32 from their
// fp16 values, as they trained.
Probabilities score_slides(vk::Context& context, const Cohort& cohort, const MilOptions& mil,
                           std::map<std::string, HostArray> parameters, const std::vector<size_t>& slides) {
  int64_t rows = 0;
  for (size_t s : slides) rows = std::max(rows, cohort.bags[s].instances);
  auto classes = cohort.classes.size();
  ResolvedModel model;
  model.graph = head_graph(mil.head, attention_hidden(mil), static_cast<int64_t>(classes), HeadUse::score);
  model.checkpoint.emplace();
  model.checkpoint->params = std::move(parameters);
  model.source = "the head trained on the other folds";
  InferenceOptions setup;
  setup.inputs = {{"features", {rows, cohort.width}}, {"count", {1}, DType::u32}};
  setup.advice = "lower --attention-hidden, or raise --device-memory-limit";
  Inference head(context, model, setup);
  Probabilities probabilities;
  for (size_t s : slides) {
    const Bag& bag = cohort.bags[s];
    std::vector<float> widened = bag.halves.empty() ? std::vector<float>() : from_half(bag.halves);
    const std::vector<float>& features = bag.halves.empty() ? bag.features : widened;
    std::memcpy(head.input("features").buffer().mapped(), features.data(), features.size() * sizeof(float));
    auto count = static_cast<uint32_t>(bag.instances);
    std::memcpy(head.input("count").buffer().mapped(), &count, sizeof(count));
    head.run();
    std::vector<float> logits = head.output().download();
    probabilities.push_back(softmax(logits.data(), classes));
  }
  return probabilities;
}

// `cv` of the folds done so far: each metric's mean, std and values.
nlohmann::json summary_of(const nlohmann::json& fold_records) {
  nlohmann::json cv = nlohmann::json::object();
  for (const char* name : metric_names) {
    std::vector<double> values;
    for (auto& record : fold_records) values.push_back(record[name].get<double>());
    Spread s = spread(values);
    cv[name] = {{"mean", s.mean}, {"std", s.std}, {"folds", values}};
  }
  return cv;
}

// The summary as flat metrics a sweep can take as its objective: cv_auc_mean, cv_auc_std,
// cv_auc_mean_less_std (the mean less one standard deviation: a setting good on every fold), ...
nlohmann::json objective_metrics(const nlohmann::json& cv, double mean_loss) {
  nlohmann::json metrics = {{"val_loss", mean_loss}};
  for (const char* name : metric_names) {
    std::string prefix = std::string("cv_") + name;
    double mean = cv[name]["mean"].get<double>(), std = cv[name]["std"].get<double>();
    metrics[prefix + "_mean"] = mean;
    metrics[prefix + "_std"] = std;
    metrics[prefix + "_mean_less_std"] = mean - std;
    metrics[prefix + "_folds"] = cv[name]["folds"];  // each run's, for the sweep's report
  }
  return metrics;
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

// One row a held-out slide and run: seed, fold (from 1), case, slide, label, the prediction and
// each class's probability.
void add_prediction_rows(std::string& csv, const Cohort& cohort, uint32_t seed, int fold,
                         const std::vector<size_t>& slides, const Probabilities& probabilities) {
  for (size_t i = 0; i < slides.size(); ++i) {
    const SlideLabel& row = cohort.rows[slides[i]];
    const auto& p = probabilities[i];
    auto predicted = static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin());
    csv += std::to_string(seed) + "," + std::to_string(fold) + "," + csv_field(row.case_id) + "," +
           csv_field(row.slide) + "," + csv_field(row.label) + "," + csv_field(cohort.classes[predicted]);
    for (double value : p) csv += "," + number(value);
    csv += "\n";
  }
}

// The folds of one seed before any training: each fold's cases and slides, in all and by class.
void report_folds(const Cohort& cohort, const std::vector<uint32_t>& fold_of_slide, int folds, uint32_t seed) {
  nlohmann::json record = {{"event", "folds"}, {"seed", seed}, {"classes", cohort.classes}};
  std::string line = "folds (seed " + std::to_string(seed) + "):";
  for (int k = 0; k < folds; ++k) {
    std::set<std::string> cases;
    std::vector<uint64_t> per_class(cohort.classes.size());
    uint64_t slides = 0;
    for (size_t s = 0; s < fold_of_slide.size(); ++s) {
      if (fold_of_slide[s] != static_cast<uint32_t>(k)) continue;
      cases.insert(cohort.rows[s].case_id);
      ++per_class[cohort.bags[s].label];
      ++slides;
    }
    record["folds"].push_back({{"fold", k + 1}, {"cases", cases.size()}, {"slides", slides}, {"slides_per_class", per_class}});
    std::string counts;
    for (size_t c = 0; c < per_class.size(); ++c)
      counts += (c ? ", " : "") + cohort.classes[c] + " " + std::to_string(per_class[c]);
    line += std::string(k ? ";" : "") + " " + std::to_string(k + 1) + ": " + std::to_string(cases.size()) + " cases, " +
            std::to_string(slides) + " slides (" + counts + ")";
  }
  report("train", record, line);
}

}  // namespace

nlohmann::json cross_validate_mil(vk::Context& context, const TrainOptions& given, const MilOptions& mil,
                                  const CrossValidationOptions& cv, const TrainReporting& reporting) {
  check_clam_flags(mil);
  if (cv.folds < 2) throw UsageError("--folds must be at least 2 (got " + std::to_string(cv.folds) + ")");
  if (cv.seeds < 1) throw UsageError("--seeds must be at least 1 (got " + std::to_string(cv.seeds) + ")");
  if (given.epochs < 1) throw UsageError("--epochs must be at least 1");
  TrainOptions options = given;
  options.batch = 1;  // one bag a step
  options.accumulate = 1;
  options.checkpoint.clear();
  options.resume = false;
  options.job_settings = mil_settings(mil);
  Cohort cohort = read_cohort(mil, options.fp16);
  check_bags_within_kernel_loops(context.info(), cohort);
  std::vector<uint32_t> labels;
  for (auto& bag : cohort.bags) labels.push_back(bag.label);
  // Every seed's folds before any training: a split that cannot work is refused before any work.
  std::vector<std::vector<uint32_t>> fold_of_slide;
  for (int r = 0; r < cv.seeds; ++r)
    fold_of_slide.push_back(case_folds(cohort.rows, labels, cohort.classes, cv.folds,
                                       options.seed + static_cast<uint32_t>(r), mil.labels));

  if (reporting.progress)
    for (int r = 0; r < cv.seeds; ++r) report_folds(cohort, fold_of_slide[r], cv.folds, options.seed + static_cast<uint32_t>(r));

  auto runs = static_cast<uint64_t>(cv.folds) * static_cast<uint64_t>(cv.seeds);
  std::unique_ptr<Progress> progress;
  if (reporting.progress) progress = std::make_unique<Progress>("train", runs, "cross-validation");
  std::string csv = "seed,fold,case_id,slide_id,label,predicted";
  for (auto& name : cohort.classes) csv += "," + csv_field("p_" + name);
  csv += "\n";
  nlohmann::json fold_records = nlohmann::json::array();
  double loss_sum = 0;
  const bool recompute_attention = recomputes_attention(context, cohort, mil, options);  // every fold's plan alike
  for (int r = 0; r < cv.seeds; ++r) {
    TrainOptions run = options;
    run.seed = options.seed + static_cast<uint32_t>(r);
    for (int k = 0; k < cv.folds; ++k) {
      std::vector<size_t> train_slides, fold_slides;
      for (size_t s = 0; s < cohort.bags.size(); ++s)
        (fold_of_slide[r][s] == static_cast<uint32_t>(k) ? fold_slides : train_slides).push_back(s);
      std::map<std::string, HostArray> parameters;
      nlohmann::json last;  // the loop's final record: its val_loss is the loss on this fold
      {
        TrainingLoop loop(context, loop_settings(run), head_job(cohort, mil, run, recompute_attention));
        BagFeed train_feed(cohort.bags, train_slides, true, run.seed), fold_feed(cohort.bags, fold_slides, false, run.seed);
        TrainReporting quiet;
        quiet.progress = false;
        quiet.protocol = [&last](const nlohmann::json& line) {
          if (line.value("type", "") == "final") last = line["metrics"];
        };
        loop.run(train_feed, fold_feed, quiet);
        parameters = loop.parameters();
      }
      Probabilities probabilities = score_slides(context, cohort, mil, std::move(parameters), fold_slides);
      std::vector<uint32_t> fold_labels;
      for (size_t s : fold_slides) fold_labels.push_back(labels[s]);
      ClassificationMetrics metrics =
          classification_metrics(probabilities, fold_labels, static_cast<uint32_t>(cohort.classes.size()));
      double loss = last.value("val_loss", 0.0);
      loss_sum += loss;
      nlohmann::json record = {{"event", "fold"}, {"seed", run.seed}, {"fold", k + 1}, {"folds", cv.folds},
                               {"train_slides", train_slides.size()}, {"slides", fold_slides.size()},
                               {"loss", loss}, {"auc", metrics.auc}, {"balanced_accuracy", metrics.balanced_accuracy},
                               {"f1", metrics.f1}};
      // fp16: the loss scale it ended at and the steps skipped for gradients that overflowed,
      // which move its scores from fp32's by more than rounding.
      for (const char* key : {"loss_scale", "skipped_steps"})
        if (last.contains(key)) record[key] = last[key];
      fold_records.push_back(record);
      add_prediction_rows(csv, cohort, run.seed, k + 1, fold_slides, probabilities);
      if (progress) {
        progress->update(fold_records.size());
        progress->event(record, "seed " + std::to_string(run.seed) + " fold " + std::to_string(k + 1) + "/" +
                                    std::to_string(cv.folds) + "  " + std::to_string(fold_slides.size()) +
                                    " slides  loss " + format_number(loss) + "  AUC " + format_number(metrics.auc) +
                                    "  balanced accuracy " + format_number(metrics.balanced_accuracy) + "  F1 " +
                                    format_number(metrics.f1));
      }
      if (reporting.protocol) {
        double mean_loss = loss_sum / static_cast<double>(fold_records.size());
        reporting.protocol({{"type", "intermediate"},
                            {"step", fold_records.size()},
                            {"value", mean_loss},
                            {"metrics", objective_metrics(summary_of(fold_records), mean_loss)}});
      }
    }
  }
  if (progress) progress->finish();
  nlohmann::json summary = summary_of(fold_records);
  double mean_loss = loss_sum / static_cast<double>(fold_records.size());
  if (!cv.predictions.empty()) write_file_replacing(cv.predictions, csv);
  if (reporting.protocol)
    reporting.protocol({{"type", "final"},
                        {"value", mean_loss},
                        {"metrics", objective_metrics(summary, mean_loss)},
                        {"peak_device_bytes", context.allocator().stats().peak_bytes},
                        {"device", context.info().name}});
  return {{"head", mil.head},
          {"classes", cohort.classes},
          {"slides", cohort.bags.size()},
          {"folds", cv.folds},
          {"seeds", cv.seeds},
          {"epochs", options.epochs},
          {"fold_results", fold_records},
          {"predictions", cv.predictions.empty() ? nlohmann::json() : nlohmann::json(cv.predictions)},
          {"cv", summary}};
}

std::string cross_validation_table(const nlohmann::json& result) {
  std::vector<TableColumn> columns = {{"seed", false}, {"fold", true},   {"slides", true}, {"loss", true},
                                      {"AUC", true},  {"bal. acc.", true}, {"F1 (macro)", true}};
  std::vector<std::vector<std::string>> rows;
  for (auto& fold : result["fold_results"])
    rows.push_back({format_number(fold["seed"]), format_number(fold["fold"]), format_number(fold["slides"]),
                    format_number(fold["loss"]), format_number(fold["auc"]), format_number(fold["balanced_accuracy"]),
                    format_number(fold["f1"])});
  const nlohmann::json& cv = result["cv"];
  auto shown = [&](const char* name) {
    return format_number(cv[name]["mean"]) + " (" + format_number(cv[name]["std"]) + ")";
  };
  std::vector<double> losses;
  for (auto& fold : result["fold_results"]) losses.push_back(fold["loss"].get<double>());
  Spread loss = spread(losses);
  // ASCII only: the table aligns bytes.
  rows.push_back({"mean (std)", "", "", format_number(loss.mean) + " (" + format_number(loss.std) + ")", shown("auc"),
                  shown("balanced_accuracy"), shown("f1")});
  std::string text = aligned_table(columns, rows, true);
  text += std::to_string(result["folds"].get<int>()) + "-fold cross-validation by case, " +
          std::to_string(result["seeds"].get<int>()) + " seed(s), " + result["head"].get<std::string>() +
          " head; std is the sample standard deviation over the " + std::to_string(rows.size() - 1) + " runs\n";
  if (result["predictions"].is_string())
    text += "predictions of every held-out slide: " + result["predictions"].get<std::string>() + "\n";
  return text;
}

}  // namespace tessera
