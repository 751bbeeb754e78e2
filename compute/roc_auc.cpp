#include "compute/roc_auc.h"

#include <algorithm>

namespace tessera {

std::optional<double> roc_auc(std::vector<std::pair<double, uint32_t>> scored) {
  std::sort(scored.begin(), scored.end());
  double positives = 0, negatives = 0, rank_sum = 0;
  // Ranks from 1; a run of equal scores shares its mean rank.
  for (size_t start = 0; start < scored.size();) {
    size_t end = start;
    while (end < scored.size() && scored[end].first == scored[start].first) ++end;
    double mean_rank = 0.5 * static_cast<double>(start + 1 + end);
    for (size_t i = start; i < end; ++i) {
      if (scored[i].second == 1) {
        ++positives;
        rank_sum += mean_rank;
      } else {
        ++negatives;
      }
    }
    start = end;
  }
  if (positives == 0 || negatives == 0) return std::nullopt;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

void BinaryScores::add(const std::vector<float>& logits, const std::vector<uint32_t>& labels, size_t count) {
  for (size_t i = 0; i < count && 2 * i + 1 < logits.size() && i < labels.size(); ++i)
    scored_.emplace_back(static_cast<double>(logits[2 * i + 1]) - logits[2 * i], labels[i]);
}

}  // namespace tessera
