// Slide-level multiple-instance learning on spilled features (`tessera train --features`):
// one slide's feature file is one bag, pooled by its mean, its max per feature or gated
// attention (Ilse et al. 2018) and classified by a linear layer, or classified by DSMIL (Li et al.
// 2021: an instance classifier, attention to each class's critical instance, a bag classifier) or
// CLAM (Lu et al. 2021: gated attention, one branch or one a class, with an instance clustering
// loss on the top and bottom k patches) or TransMIL (Shao et al. 2021: two Nystrom-attention
// layers over the bag wrapped to a square, a convolutional position encoding between them); the
// backbone never runs.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "compute/trainer.h"
#include "jobs/train_options.h"

namespace tessera {

// The settings of the clam-sb and clam-mb heads (--k-sample, --bag-weight, --subtyping), unset
// where the flag was not given; an error on any other head.
struct ClamOptions {
  std::optional<int> k_sample;       // default 8, CLAM's main.py --B
  std::optional<double> bag_weight;  // default 0.7, main.py --bag_weight
  std::optional<bool> subtyping;     // default: more than two classes, as CLAM's subtyping task sets it
};

struct MilOptions {
  std::string features;      // DIR of <slide>.h5 feature files
  std::string labels;        // CSV of `slide,label` rows, or CLAM's `case_id,slide_id,label` (slide_labels.h)
  std::string head = "attention";  // one of mil_heads()
  // L, the width of the attention branches V and U (dsmil: of its queries); 0: the head's own,
  // 128 (clam-sb and clam-mb: 256, CLAM's size "small")
  int attention_hidden = 0;
  ClamOptions clam;
};

// --k-sample, --bag-weight and --subtyping: a clam head's alone, and in range (UsageError naming the flag).
void check_clam_flags(const MilOptions& mil);

// --attention-hidden, or the head's default where it was not given.
int attention_hidden(const MilOptions& mil);

// The heads `--head` takes: attention (gated, ABMIL), mean and max pooling, dsmil, clam-sb, clam-mb and transmil.
const std::vector<std::string>& mil_heads();
// "attention, mean, max, dsmil, clam-sb, clam-mb or transmil": the heads for a message.
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
// instance classifier; clam-sb's and clam-mb's their attention (clam-mb: the last class's
// column), transmil's the attention from the class token in its second layer, each as the
// tile's percentile in the slide, as CLAM's create_heatmaps.py shows it (rank, ties averaged,
// over the tile count: in (0, 1]). Throws BadInput naming
// the feature file or the checkpoint when either is missing or corrupt, or when they do not fit
// each other.
std::vector<float> tile_scores(vk::Context& context, const std::string& features_path,
                               const std::string& checkpoint_path);

}  // namespace tessera
