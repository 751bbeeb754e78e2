// Cross-validation's parts on the host: the metrics on predictions worked out by hand (ties in
// the AUC, a class never predicted), the spread, and the folds (cases kept together, each class
// dealt evenly, the same from the same seed, refusals naming the case or the fold and class).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "common/error.h"
#include "jobs/case_folds.h"
#include "jobs/classification_metrics.h"

namespace tessera {
namespace {

TEST(ClassificationMetrics, TwoClassesWithATie) {
  // P(class 1): positives 0.9 and 0.4, negatives 0.4 and 0.1: 3 pairs won and 1 tied of 4.
  std::vector<std::vector<double>> p = {{0.1, 0.9}, {0.6, 0.4}, {0.6, 0.4}, {0.9, 0.1}};
  auto m = classification_metrics(p, {1, 1, 0, 0}, 2);
  EXPECT_DOUBLE_EQ(m.auc, 3.5 / 4);
  // Predicted 1, 0, 0, 0: recall 1 and 1/2; F1 2*2/(3+2) and 2*1/(1+2).
  EXPECT_DOUBLE_EQ(m.balanced_accuracy, 0.75);
  EXPECT_DOUBLE_EQ(m.f1, (0.8 + 2.0 / 3) / 2);
}

TEST(ClassificationMetrics, ThreeClassesOneNeverPredicted) {
  std::vector<std::vector<double>> p = {{0.7, 0.2, 0.1}, {0.2, 0.7, 0.1}, {0.5, 0.1, 0.4}};
  auto m = classification_metrics(p, {0, 1, 2}, 3);
  EXPECT_DOUBLE_EQ(m.auc, 1.0);  // each class's own sample scores it highest
  EXPECT_DOUBLE_EQ(m.balanced_accuracy, 2.0 / 3);
  EXPECT_DOUBLE_EQ(m.f1, (2.0 / 3 + 1 + 0) / 3);
  EXPECT_THROW(classification_metrics(p, {0, 1, 1}, 3), std::invalid_argument);
}

TEST(Spread, SampleStandardDeviation) {
  Spread s = spread({1, 2, 3, 4});
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_NEAR(s.std, std::sqrt(5.0 / 3), 1e-15);
  EXPECT_EQ(spread({5}).std, 0);
}

// 20 cases (12 of class 0, 8 of class 1) of one to three slides.
struct Rows {
  std::vector<SlideLabel> rows;
  std::vector<uint32_t> labels;
  std::vector<std::string> classes = {"normal", "tumor"};
};

Rows cohort() {
  Rows r;
  for (int c = 0; c < 20; ++c) {
    uint32_t label = c < 12 ? 0 : 1;
    for (int s = 0; s <= c % 3; ++s) {
      std::string slide = "c" + std::to_string(c) + "s" + std::to_string(s);
      r.rows.push_back({slide, "case" + std::to_string(c), r.classes[label], slide + ".h5",
                        static_cast<int>(r.rows.size()) + 2});
      r.labels.push_back(label);
    }
  }
  return r;
}

TEST(CaseFolds, CasesTogetherClassesEvenSameFromTheSeed) {
  Rows r = cohort();
  auto folds = case_folds(r.rows, r.labels, r.classes, 4, 11, "labels.csv");
  std::map<std::string, uint32_t> fold_of_case;
  std::map<std::pair<uint32_t, uint32_t>, int> cases_per_fold_class;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    auto [at, fresh] = fold_of_case.emplace(r.rows[i].case_id, folds[i]);
    EXPECT_EQ(at->second, folds[i]) << r.rows[i].case_id;
    if (fresh) ++cases_per_fold_class[{folds[i], r.labels[i]}];
  }
  for (uint32_t k = 0; k < 4; ++k) {
    EXPECT_EQ((cases_per_fold_class[{k, 0}]), 3) << k;  // 12 cases over 4 folds
    EXPECT_EQ((cases_per_fold_class[{k, 1}]), 2) << k;  // 8 over 4
  }
  EXPECT_EQ(folds, case_folds(r.rows, r.labels, r.classes, 4, 11, "labels.csv"));
  EXPECT_NE(folds, case_folds(r.rows, r.labels, r.classes, 4, 12, "labels.csv"));
}

TEST(CaseFolds, RefusalsNameTheCaseOrTheFold) {
  Rows r = cohort();
  try {
    case_folds(r.rows, r.labels, r.classes, 9, 0, "labels.csv");
    FAIL() << "9 folds for 8 cases of tumor";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("without a case of class 'tumor', which has 8 case(s)"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--folds 8 or fewer"), std::string::npos) << e.what();
  }
  r.labels[1] = 1;  // case1's second slide now tumor, its first normal
  try {
    case_folds(r.rows, r.labels, r.classes, 2, 0, "labels.csv");
    FAIL() << "a case of two classes";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("case case1 has slides of two classes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
