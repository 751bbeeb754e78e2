// Cross-validation of a slide-level head (`tessera train --features DIR --labels CSV --folds K
// [--seeds N]`): the slides split into K folds by case, stratified by label (case_folds.h); for
// each seed and fold a head trained on the other folds and scored on this one; each fold's AUC,
// balanced accuracy and macro F1 (classification_metrics.h), and their mean and spread.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "compute/trainer.h"
#include "jobs/mil.h"
#include "jobs/train_options.h"

namespace tessera {

struct CrossValidationOptions {
  int folds = 0;  // K, at least 2
  int seeds = 1;  // repeats: repeat r splits and initialises from --seed + r
  // CSV of every held-out slide's class probabilities (seed, fold, case, slide, label,
  // prediction, one column a class); empty: none. Written at the end through a temporary; the
  // caller holds its lock and has checked that it may be replaced.
  std::string predictions;
};

// Trains K x N heads with the shared flags of `options` (epochs, optimizer, lr, seed, precision,
// class weights; no checkpoint, no validation split: each fold is its head's held-out set and
// its loss the epoch records' val_loss). Reports a `fold` record per head as it ends (a line on a
// terminal) and, through `reporting.protocol`, an intermediate record per fold whose metrics are
// the running cv_* means and a final one with them all (sweep --objective cv_auc_mean). Returns
// the result: `folds`, `seeds`, `classes`, each fold's record, and `cv`: for `auc`,
// `balanced_accuracy` and `f1` the `mean`, sample `std` and the `folds` values, seed by seed.
// Throws BadInput (a case with two labels, a fold without a class, a feature file), UsageError
// (--folds below 2, --seeds below 1), and what train_mil throws.
nlohmann::json cross_validate_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil,
                                  const CrossValidationOptions& cv, const TrainReporting& reporting);

// The result as people read it: a row a fold (seed, fold, slides, loss, AUC, balanced accuracy,
// F1), then each one's mean and, in brackets, standard deviation.
std::string cross_validation_table(const nlohmann::json& result);

}  // namespace tessera
