// ROC AUC of a two-class model's validation predictions, reported by train as val_auc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace tessera {

// The area under the ROC curve: the chance that a random positive (label 1) scores above a
// random negative, ties counting half (the Mann-Whitney U statistic over n1 n0). nullopt when
// one class is absent. Labels other than 0 and 1 are not allowed.
std::optional<double> roc_auc(std::vector<std::pair<double, uint32_t>> scored);

// Collects the scores of a two-class model batch by batch: the logit margin z1 - z0 (softmax's
// P(class 1) is monotone in it, so the AUC is the same).
class BinaryScores {
 public:
  void clear() { scored_.clear(); }
  // `logits` is [batch, 2]; the first `count` rows are real samples.
  void add(const std::vector<float>& logits, const std::vector<uint32_t>& labels, size_t count);
  void add(double score, uint32_t label) { scored_.emplace_back(score, label); }
  const std::vector<std::pair<double, uint32_t>>& scored() const { return scored_; }
  std::optional<double> auc() const { return roc_auc(scored_); }

 private:
  std::vector<std::pair<double, uint32_t>> scored_;
};

}  // namespace tessera
