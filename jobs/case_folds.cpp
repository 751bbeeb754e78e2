#include "jobs/case_folds.h"

#include <algorithm>
#include <map>
#include <random>

#include "common/error.h"

namespace tessera {

std::vector<uint32_t> case_folds(const std::vector<SlideLabel>& rows, const std::vector<uint32_t>& labels,
                                 const std::vector<std::string>& classes, int folds, uint32_t seed,
                                 const std::string& labels_path) {
  // Cases in the order of their first row, each with its slides and its one label.
  std::map<std::string, size_t> case_index;
  std::vector<std::vector<size_t>> case_rows;
  std::vector<uint32_t> case_label;
  for (size_t r = 0; r < rows.size(); ++r) {
    auto [at, fresh] = case_index.emplace(rows[r].case_id, case_rows.size());
    if (fresh) {
      case_rows.emplace_back();
      case_label.push_back(labels[r]);
    } else if (case_label[at->second] != labels[r]) {
      const SlideLabel& first = rows[case_rows[at->second].front()];
      throw BadInput(labels_path + " row " + std::to_string(rows[r].row) + ": case " + rows[r].case_id +
                     " has slides of two classes (" + first.slide + " at row " + std::to_string(first.row) + " '" +
                     first.label + "', " + rows[r].slide + " '" + rows[r].label +
                     "'): cross-validation keeps a case's slides in one fold, so a case needs one label");
    }
    case_rows[at->second].push_back(r);
  }
  std::vector<std::vector<size_t>> class_cases(classes.size());
  for (size_t c = 0; c < case_rows.size(); ++c) class_cases[case_label[c]].push_back(c);
  std::mt19937 generator(seed);
  std::vector<uint32_t> fold_of_row(rows.size());
  size_t dealt = 0;
  for (size_t label = 0; label < classes.size(); ++label) {
    auto& cases = class_cases[label];
    if (cases.size() < static_cast<size_t>(folds)) {
      // The deal gives this class's cases to the folds from `dealt` on: the next one is left without.
      size_t missing = (dealt + cases.size()) % static_cast<size_t>(folds);
      std::string remedy = cases.size() >= 2 ? "use --folds " + std::to_string(cases.size()) + " or fewer"
                                             : "cross-validation needs at least two cases of every class";
      throw BadInput(labels_path + ": --folds " + std::to_string(folds) + " leaves fold " + std::to_string(missing + 1) +
                     " without a case of class '" + classes[label] + "', which has " + std::to_string(cases.size()) +
                     " case(s): every fold needs each class for its AUC; " + remedy);
    }
    std::shuffle(cases.begin(), cases.end(), generator);
    for (size_t c : cases) {
      for (size_t r : case_rows[c]) fold_of_row[r] = static_cast<uint32_t>(dealt % static_cast<size_t>(folds));
      ++dealt;
    }
  }
  return fold_of_row;
}

}  // namespace tessera
