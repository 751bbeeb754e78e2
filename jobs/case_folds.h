// The folds of `train --features --folds K`: slides split by case (every slide of a patient in
// one fold, so no patient is both trained on and scored), stratified by label, drawn from a seed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "jobs/slide_labels.h"

namespace tessera {

// The fold (0 to folds - 1) of each of `rows`, whose class indices into `classes` are `labels`.
// Each class's cases, in the order of their first row, are shuffled by `seed` and dealt to the
// folds in turn, the deal going on from class to class, so that every fold holds a near-equal
// share of each class's cases (within one) and of all cases. The same rows, folds and seed give
// the same folds. Throws BadInput naming `labels_path`, the case and its rows when a case's
// slides carry two labels, and naming the fold and the class when a fold would hold no case of a
// class (more folds than that class has cases).
std::vector<uint32_t> case_folds(const std::vector<SlideLabel>& rows, const std::vector<uint32_t>& labels,
                                 const std::vector<std::string>& classes, int folds, uint32_t seed,
                                 const std::string& labels_path);

}  // namespace tessera
