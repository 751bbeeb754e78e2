// Slide-level multiple-instance learning on spilled features (`tessera train --features`):
// one slide's feature file is one bag, pooled by its mean, its max per feature or gated
// attention (Ilse et al. 2018) and classified by a linear layer, or classified by DSMIL (Li et al.
// 2021: an instance classifier, attention to each class's critical instance, a bag classifier);
// the backbone never runs.
#pragma once
#include <string>
#include <vector>

#include "compute/trainer.h"
#include "jobs/train_options.h"

namespace tessera {

struct MilOptions {
  std::string features;      // DIR of <slide>.h5 feature files
  std::string labels;        // CSV of `slide,label` rows, or CLAM's `case_id,slide_id,label` (slide_labels.h)
  std::string head = "attention";  // one of mil_heads()
  int attention_hidden = 128;      // L, the width of the attention branches V and U (dsmil: of its queries)
};

// The heads `--head` takes: attention (gated, ABMIL), mean and max pooling, and dsmil.
const std::vector<std::string>& mil_heads();
// "attention, mean, max or dsmil": the heads for a message.
std::string mil_head_list();

// The settings of `mil` that a resumed run must share (TrainOptions::job_settings): the
// features directory and labels file (as canonical paths), the head and its width.
nlohmann::json mil_settings(const MilOptions& mil);

// Device bytes of training the head on these features, by category (what --dry-run prints);
// reads every feature file, so it throws what train_mil throws before any work.
MemoryPlan plan_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil);

// Trains a head with the shared flags of `options` (epochs, optimizer, seed, val_fraction,
// class_weights, checkpoint, resume). Throws BadInput naming a missing or corrupt feature
// file or a malformed labels file, UsageError on flags, OutOfDeviceMemory when the plan is
// over the budget, Diverged on a non-finite loss.
void train_mil(vk::Context& context, const TrainOptions& options, const MilOptions& mil,
               const TrainReporting& reporting);

// Per-tile scores of one slide's feature file under a head that train_mil saved, from the
// head's own ops on the device, in the file's row order: each tile's probability of the last
// class ("1", "tumor") under the head's classifier, as the head would score a bag of that tile
// alone (attention, a mean or a max over one instance is that instance); dsmil's under its
// instance classifier. Throws BadInput naming
// the feature file or the checkpoint when either is missing or corrupt, or when they do not fit
// each other.
std::vector<float> tile_scores(vk::Context& context, const std::string& features_path,
                               const std::string& checkpoint_path);

}  // namespace tessera
