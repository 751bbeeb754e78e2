#include "jobs/classification_metrics.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "compute/roc_auc.h"

namespace tessera {

ClassificationMetrics classification_metrics(const std::vector<std::vector<double>>& probabilities,
                                             const std::vector<uint32_t>& labels, uint32_t classes) {
  std::vector<double> true_positives(classes), predicted(classes), actual(classes);
  for (size_t i = 0; i < labels.size(); ++i) {
    const auto& row = probabilities[i];
    auto guess = static_cast<uint32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    ++predicted[guess];
    ++actual[labels[i]];
    if (guess == labels[i]) ++true_positives[guess];
  }
  ClassificationMetrics metrics;
  // Two classes: one AUC, of class 1 (its one-vs-rest twin for class 0 is the same number).
  uint32_t first_scored = classes == 2 ? 1 : 0;
  for (uint32_t c = 0; c < classes; ++c) {
    if (actual[c] == 0) throw std::invalid_argument("classification_metrics: a class without samples");
    metrics.balanced_accuracy += true_positives[c] / actual[c];
    metrics.f1 += 2 * true_positives[c] / (predicted[c] + actual[c]);
    if (c < first_scored) continue;
    std::vector<std::pair<double, uint32_t>> scored;
    for (size_t i = 0; i < labels.size(); ++i) scored.emplace_back(probabilities[i][c], labels[i] == c ? 1u : 0u);
    metrics.auc += roc_auc(std::move(scored)).value_or(0.5);
  }
  metrics.auc /= classes - first_scored;
  metrics.balanced_accuracy /= classes;
  metrics.f1 /= classes;
  return metrics;
}

std::vector<double> softmax(const float* logits, size_t classes) {
  float top = *std::max_element(logits, logits + classes);
  std::vector<double> probabilities(classes);
  double sum = 0;
  for (size_t c = 0; c < classes; ++c) sum += probabilities[c] = std::exp(static_cast<double>(logits[c] - top));
  for (double& probability : probabilities) probability /= sum;
  return probabilities;
}

Spread spread(const std::vector<double>& values) {
  Spread result;
  if (values.empty()) return result;
  for (double value : values) result.mean += value;
  result.mean /= static_cast<double>(values.size());
  if (values.size() < 2) return result;
  double squares = 0;
  for (double value : values) squares += (value - result.mean) * (value - result.mean);
  result.std = std::sqrt(squares / static_cast<double>(values.size() - 1));
  return result;
}

}  // namespace tessera
