// What cross-validation reports of a fold's predictions, and their spread over folds: the
// definitions scikit-learn uses, so that numbers compare with other tools' (roc_auc_score with
// multi_class="ovr", average="macro"; balanced_accuracy_score; f1_score(average="macro")).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera {

struct ClassificationMetrics {
  double auc = 0;                // two classes: of P(class 1); more: each class against the rest, averaged
  double balanced_accuracy = 0;  // the recall of each class, averaged
  double f1 = 0;                 // each class's F1 (2 TP / (2 TP + FP + FN)), averaged
};

// `probabilities` holds a row of `classes` class probabilities per sample; the prediction is the
// most probable class (the first of equals). Every class must have a sample (the folds see to
// it); throws std::invalid_argument otherwise.
ClassificationMetrics classification_metrics(const std::vector<std::vector<double>>& probabilities,
                                             const std::vector<uint32_t>& labels, uint32_t classes);

// Softmax of one sample's `classes` logits, in double from the largest logit down (no overflow).
std::vector<double> softmax(const float* logits, size_t classes);

// The mean and the sample standard deviation (n - 1 in the denominator; 0 for one value).
struct Spread {
  double mean = 0, std = 0;
};
Spread spread(const std::vector<double>& values);

}  // namespace tessera
