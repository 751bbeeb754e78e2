// The bags of a slide-level head (jobs/mil.h) and what trains on them, shared by one training
// run (mil.cpp) and cross-validation (mil_cross_validation.cpp): each slide's feature file one
// bag, the cohort of a labels file, the head as a graph, and a Feed of bags one at a time.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/training_job.h"
#include "compute/vk/context.h"
#include "jobs/mil.h"
#include "jobs/slide_labels.h"

namespace tessera {

struct Bag {
  std::string slide;
  uint32_t label = 0;
  int64_t instances = 0;
  std::vector<float> features;   // [instances, width]
  std::vector<uint16_t> halves;  // the same in fp16, in place of `features` for --precision fp16

  // Rounds the features to fp16 once, at load; a value past fp16's range is refused, not made infinite.
  void to_fp16(const std::string& path);
  const void* staged_bytes() const {
    return halves.empty() ? static_cast<const void*>(features.data()) : halves.data();
  }
  size_t staged_size() const {
    return halves.empty() ? features.size() * sizeof(float) : halves.size() * sizeof(uint16_t);
  }
};

// One feature file as a bag; `width` is the other bags' D (0: none read yet), and becomes this one's.
// With `fp16` the bag holds its features rounded to fp16, as --precision fp16 stages them.
Bag read_bag_file(const std::string& path, const std::string& slide, int64_t& width, bool fp16);

// A clam head's settings, resolved (ClamOptions' defaults filled in for a cohort's classes).
struct ClamSettings {
  int64_t k_sample = 8;
  double bag_weight = 0.7;
  bool subtyping = false;
};
ClamSettings clam_settings(const ClamOptions& options, size_t classes);
bool is_clam_head(const std::string& kind);

// What a head's graph is for: training (over the staged bag "features" [M,D], "count" [1] and
// "labels" [1]: clam's instance loss reads the label), scoring bags (no labels), or tile scores:
// the classifier reads every instance instead of their pool (dsmil: its instance classifier;
// clam: the attention scores [M, 1 or C]).
enum class HeadUse { train, score, tile_scores };

// The head as a graph: the model that the shared loop trains and that scoring runs.
// recompute_attention: TransMIL's attention computes q, k, v and its pseudo-inverse again in
// backward rather than keep them from forward (NystromAttention's `recompute`).
nlohmann::json head_graph(const std::string& kind, int64_t hidden, int64_t classes, HeadUse use = HeadUse::train,
                          const ClamSettings& clam = {}, bool recompute_attention = true);

// The terms of a head's loss beside its logits' (TrainingJob::logits_loss_weight, extra_losses):
// dsmil's half bag, half the max over instances of its instance classifier; clam's bag_weight of
// the bag and the rest its instance loss; the others none.
void set_head_losses(const std::string& kind, TrainingJob& job, const ClamSettings& clam = {});

// The slides of a labels file as bags, with their classes: the labels sorted, each bag's label
// its index among them. Throws BadInput naming the file (fewer than two labels) or a feature file.
struct Cohort {
  std::vector<SlideLabel> rows;
  std::vector<std::string> classes;
  std::vector<Bag> bags;  // one a row, in the same order
  int64_t width = 0;
};
Cohort read_cohort(const MilOptions& mil, bool fp16);

// The heads' kernels loop over up to a quarter of a bag's patches in one invocation (the clam
// heads' top-k selection): on a device that bounds a kernel's loops (lavapipe: 65,535
// iterations, so bags of up to 262,140 patches) a larger bag would be summed in part. Throws
// OutOfDeviceMemory (exit 3, before any work) naming the largest bag's slide, its patches and the
// device's bound.
void check_bags_within_kernel_loops(const vk::DeviceInfo& device, const Cohort& cohort);

// The head over a cohort as a job for the shared loop: its description (what checkpoints hold),
// graph, staged inputs (bags padded to the largest) and settings; no start, no report.
TrainingJob head_job(const Cohort& cohort, const MilOptions& mil, const TrainOptions& options, bool recompute_attention);
// head_job's recompute_attention for `context`: TransMIL's attention keeps from forward what its
// backward reads (faster: bench/README.md) where that plan fits the budget, and computes it again
// where it does not (a bag of 100,000 patches on lavapipe). The gradients are the same to the bit
// either way. False for the other heads.
bool recomputes_attention(vk::Context& context, const Cohort& cohort, const MilOptions& mil,
                          const TrainOptions& options);

// Slides one at a time, each a batch of one bag padded to the largest bag's rows; rows past
// its instances keep what they held, which the pooling ops never read.
class BagFeed : public Feed {
 public:
  BagFeed(const std::vector<Bag>& bags, std::vector<size_t> slides, bool shuffle, uint32_t seed)
      : bags_(bags), slides_(std::move(slides)), shuffle_(shuffle), seed_(seed) {}
  size_t batches_per_epoch() const override { return slides_.size(); }
  void start_epoch(uint32_t epoch) override;
  bool next(const std::map<std::string, const Tensor*>& staged) override;

 private:
  const std::vector<Bag>& bags_;
  std::vector<size_t> slides_, order_;
  bool shuffle_;
  uint32_t seed_;
  size_t next_ = 0;
};

}  // namespace tessera
