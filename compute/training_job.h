// What a job hands the training loop (compute/trainer.h): the graph and its staged inputs, a
// Feed of batches, the loop's settings and where it reports. The job's own flags (data paths,
// loader workers, augmentation) stay in the job (jobs/train_options.h); the loop sees only
// what it computes with, and the settings record it saves in checkpoints.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/checkpoint.h"
#include "compute/network.h"
#include "compute/optimizer.h"

namespace tessera {

// How the loop trains.
struct LoopSettings {
  int epochs = 1;
  int accumulate = 1;  // micro-batches per optimizer step
  OptimizerConfig optimizer;
  uint32_t seed = 0;  // initialisation and dropout
  std::vector<float> class_weights;
  std::string checkpoint;  // written after every epoch; empty: none
  // --precision fp16: activations and their gradients in fp16, dynamic loss scaling
  // (loss_scale.h); parameters, gradients and optimizer state stay float.
  bool fp16 = false;
  // --sync-bn: batch norm statistics over every replica's samples (PyTorch's SyncBatchNorm)
  // rather than each replica's own; an error on one replica.
  bool sync_batch_norm = false;
};

// Where training reports: JSON records for progress and for the trial protocol.
struct TrainReporting {
  // {"type":"batch"...} (the batch train chose), {"type":"intermediate"...}, {"type":"final"...}
  std::function<void(const nlohmann::json&)> protocol;
  bool progress = true;                                 // bar or JSON lines on stderr
};

// A job's batches as the loop sees them, in an order fixed by the seed and the epoch alone
// (so that a resumed run sees the same batches).
class Feed {
 public:
  virtual ~Feed() = default;
  virtual size_t batches_per_epoch() const = 0;
  virtual void start_epoch(uint32_t epoch) = 0;
  // Writes the next batch into the host-visible tensors of the job's staged inputs, by name;
  // false when the epoch is over.
  virtual bool next(const std::map<std::string, const Tensor*>& staged) = 0;
  // Only samples [first, first + count) of each batch will be computed here (an MPI process's
  // part): a feed may leave the others' inputs other than their labels unread.
  virtual void compute_only(int64_t first, int64_t count) {
    (void)first;
    (void)count;
  }
};

// A term of a loss of several: the softmax cross-entropy of a layer's output (logits [N,C]) against
// the staged "labels", weighted; or, `computes_loss`, the layer's own output (a loss [N], as
// softmax_cross_entropy gives), weighted. DSMIL trains on 0.5 of its bag logits' loss and 0.5 of
// the loss of the max over instances of its instance logits; CLAM on 0.7 bag and 0.3 instance
// clustering (its clam_instance_loss layer).
struct LossTerm {
  std::string layer;
  float weight = 1;
  bool computes_loss = false;
};

// The layers the loop adds after a job's graph: the softmax cross-entropy of its last layer (the
// logits) against the staged "labels", as the layer "loss", then one for each of `extra` terms
// that is not its own loss, as the layer extra_loss_name(term).
nlohmann::json loss_layers(const nlohmann::json& graph, const std::vector<LossTerm>& extra = {});
// The layer whose output is the term's loss.
inline std::string extra_loss_name(const LossTerm& term) {
  return term.computes_loss ? term.layer : "loss." + term.layer;
}

// What a job hands the loop.
struct TrainingJob {
  nlohmann::json model;  // the description saved in checkpoints (a graph, or a head's fields)
  nlohmann::json graph;  // the model as a graph of layers
  // Layers before the model (the normalisation of uint8 images into the layer "input").
  nlohmann::json prologue = nlohmann::json::array();
  // Written by the Feed for every micro-batch: what the graph reads, and "labels" u32 [N]
  // and "valid" u32 [1] (how many of the N samples are real) for the loss and the metrics.
  std::vector<GraphInput> staged;
  std::optional<Checkpoint> start;  // --resume, or weights to start from (its `train` empty)
  std::string start_path;           // the file `start` came from, for messages
  // The settings a resumed run must share, saved in every checkpoint's progress record.
  nlohmann::json settings = nlohmann::json::object();
  nlohmann::json report = nlohmann::json::object();  // added to every epoch record
  std::string advice;  // what to change when the plan is over the budget
  // The loss: the last layer's term (the logits that metrics, AUC and scores read) weighted by
  // `logits_loss_weight`, plus the `extra_losses` terms (loss_layers). One replica only: the loss
  // weights of a data-parallel run weigh the logits' term alone.
  float logits_loss_weight = 1;
  std::vector<LossTerm> extra_losses;
};

}  // namespace tessera
