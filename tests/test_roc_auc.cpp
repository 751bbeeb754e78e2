// train's val_auc: the rank formula against counting every positive-negative pair.
#include <gtest/gtest.h>

#include <random>

#include "compute/roc_auc.h"

namespace tessera {
namespace {

TEST(RocAuc, MatchesThePairwiseCount) {
  std::mt19937 random(7);
  std::uniform_int_distribution<int> coarse(0, 9);  // few distinct scores: many ties
  std::vector<std::pair<double, uint32_t>> scored;
  for (int i = 0; i < 300; ++i) {
    uint32_t label = random() % 3 == 0 ? 1u : 0u;
    scored.emplace_back(coarse(random) + (label ? 1.5 : 0.0), label);
  }
  double wins = 0, pairs = 0;
  for (auto& [p, pl] : scored)
    for (auto& [n, nl] : scored)
      if (pl == 1 && nl == 0) {
        pairs += 1;
        wins += p > n ? 1.0 : p == n ? 0.5 : 0.0;
      }
  auto auc = roc_auc(scored);
  ASSERT_TRUE(auc);
  EXPECT_NEAR(*auc, wins / pairs, 1e-12);
  EXPECT_GT(*auc, 0.55);
  EXPECT_LT(*auc, 0.95);
}

TEST(RocAuc, KnownCasesAndOneClass) {
  EXPECT_EQ(roc_auc({{0.1, 0}, {0.4, 0}, {0.35, 1}, {0.8, 1}}), 0.75);
  EXPECT_EQ(roc_auc({{0.1, 0}, {0.2, 1}}), 1.0);
  EXPECT_EQ(roc_auc({{0.5, 0}, {0.5, 1}}), 0.5);
  EXPECT_EQ(roc_auc({{0.1, 1}, {0.2, 1}}), std::nullopt);
  BinaryScores scores;
  // Logits [z0, z1] per row; the third row is padding.
  scores.add({0.0f, 1.0f, 1.0f, 0.0f, 9.0f, 9.0f}, {1, 0, 1}, 2);
  EXPECT_EQ(scores.auc(), 1.0);
}

}  // namespace
}  // namespace tessera
