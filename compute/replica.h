// One copy of the model on one device: its network, optimizer state, staged inputs (its part of
// every micro-batch) and recorded programs. Alone, a step is one command buffer per micro-batch
// with the optimizer in the last; replicated, the last also copies the gradients into host memory
// (a copy per parameter), and the optimizer runs in a program of its own once they are summed. With
// --sync-bn a micro-batch's commands break at every batch norm, where the host combines the
// replicas' statistics (ReplicaSync; compute/replica_group.h does the combining).
#pragma once
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compute/data_parallel.h"
#include "compute/loss_scale.h"
#include "compute/memory_plan.h"
#include "compute/roc_auc.h"
#include "compute/training_job.h"

namespace tessera {

// One micro-batch's host-visible tensors in one of the two slots (one filled while the other's
// step runs).
struct StagedBatch {
  std::vector<std::unique_ptr<Tensor>> inputs;  // the job's staged inputs, in TrainingJob::staged's order
  std::unique_ptr<Tensor> loss_weight;          // replicated: each sample's weight in the loss
  // --sync-bn: the host's copy of what each batch norm exchanges, by the device tensor.
  std::map<const Tensor*, std::unique_ptr<Tensor>> exchanged;
};

// A commands of a micro-batch: one program, or with --sync-bn one more after each exchange.
struct MicroBatchPrograms {
  struct Exchange {
    const Tensor* host;  // this replica's values, combined in place over every replica
    ReplicaSync::Combine combine;
    int64_t count;  // elements per channel on this replica
  };
  std::vector<std::unique_ptr<vk::Program>> programs;
  std::vector<Exchange> exchanges;  // exchanges[i] between programs[i] and programs[i + 1]
};

// Replicated, the last micro-batch's backward runs in up to kSegments programs of about equal
// parameter bytes, last layers first, each ending with the copy of the gradients it finished
// into their host copies, so that the host sums one segment's gradients, and all-reduces them
// over MPI, while the device computes the next. Each parameter has a host copy of its own: one
// buffer of them all would pass the device's largest buffer (small-cnn on 256 px tiles: fc1
// alone is 128 MiB, lavapipe's limit).
struct GradientSegment {
  size_t begin, end;  // layers [begin, end)
  size_t count;       // gradient floats
};

class Replica final : public ReplicaSync {
 public:
  // `part`: the samples of every training micro-batch of `batch` (over all replicas) that this
  // replica computes; `replicated`: one of several.
  Replica(vk::Context& device, const LoopSettings& settings, const TrainingJob& job, int64_t batch, BatchPart part,
          bool replicated);

  // Device bytes of the network and of every tensor the replica adds, in allocation order.
  MemoryPlan plan() const;
  // Copies of each staged micro-batch: two (one filled while the other's step runs), or one
  // where two do not fit (a bag of 100,000 patches of 1,536 features is 307 MB in fp16). Set
  // before allocate().
  void set_staging_slots(int slots) { slots_ = slots; }
  int staging_slots() const { return slots_; }
  void allocate();
  // From the seed, then `start`'s tensors; a mixed-precision run's loss scale from `loss_scale`.
  void initialise(const std::optional<Checkpoint>& start, const std::string& start_path,
                  std::optional<float> loss_scale);
  // TESSERA_FAULT=nan: NaN in the named tensor, or (empty name) in the last parameter.
  void inject_nan(const std::string& name);
  void record();

  vk::Context& context() const { return context_; }
  const BatchPart& part() const { return part_; }
  int64_t classes() const { return logits_.output_shape[1]; }
  bool synced() const { return replicated_ && settings_.sync_batch_norm; }
  // Layers that exchange values under --sync-bn (batch norms).
  int synced_layers() const;
  // Elements of all parameter gradients together: the host copy that replicas sum.
  int64_t gradient_count() const;

  // The staged inputs of micro-batch k in `slot`, by input name, as the Feed writes them.
  std::map<std::string, const Tensor*> staged(int slot, int k) const;
  StagedBatch& staging(int slot, int k) { return staging_[slot][static_cast<size_t>(k)]; }
  const Tensor& staged_input(int slot, int k, size_t input) const;

  MicroBatchPrograms& micro_batch(int slot, int k) { return train_programs_[slot][static_cast<size_t>(k)]; }
  const std::vector<GradientSegment>& segments() const { return segments_; }
  // Submits segments after the first of the last micro-batch's backward in `slot`.
  void submit_backward_segments(int slot);
  // Waits for segment s of the last micro-batch's backward in `slot`; its gradients in host memory,
  // a span per parameter, in the same order on every replica.
  std::vector<std::span<float>> segment_gradients(int slot, size_t s);
  // Makes the host's sums of segment `s`'s gradients visible to the device.
  void flush_segment_gradients(size_t s) const;
  void submit_update() { update_program_->submit(); }
  vk::Program& eval_program(int slot) { return *eval_programs_[slot]; }
  void wait_all();

  void reset_metrics();
  // Loss sum, correct predictions, samples since reset_metrics().
  std::array<double, 3> read_metrics();
  // val_auc of a two-class model: the slot's logits and labels, read back before it is refilled.
  void score(int slot, BinaryScores& scores);

  // Parameters and state by their PyTorch names; the optimizer's and the loop's state.
  std::map<std::string, Tensor*> checkpoint_tensors();
  std::map<std::string, Tensor*> train_tensors();
  // The model's state without a gradient (batch norm's running statistics), by name.
  std::map<std::string, Tensor*> state_tensors();
  std::optional<LossScaleState> loss_scale_state() const;

  // ReplicaSync
  int64_t batch_total() const override { return batch_; }
  void exchange(vk::Recorder& recorder, const Tensor& values, Combine combine, int64_t count) override;

 private:
  // A tensor the replica allocates beside the network's: what plan() sums and allocate()
  // creates, from this one list.
  struct Planned {
    enum class Kind { input, loss_weight, exchanged, metrics, step, loss_scale, gradients, optimizer_state };
    Kind kind;
    std::string name;
    Shape shape;
    DType dtype;
    vk::MemoryUsage usage;
    std::string category;
    int slot = 0, k = 0;
    size_t index = 0;  // input: of the staged inputs; exchanged: the layer; optimizer_state: the layer
    size_t spec = 0;   // exchanged, optimizer_state: of the layer's tensors
    bool windowed = false;  // input: bound in windows alone (Network::input_windowed)
  };
  std::vector<Planned> planned() const;
  Network::Bound bound(int slot, int k) const;
  void record_update(vk::Recorder& recorder);
  void record_metrics(vk::Recorder& recorder, int slot, int k);
  std::vector<GradientSegment> plan_segments() const;
  int64_t parameter_count(size_t layer) const;
  void record_gradient_copies(vk::Recorder& recorder, bool to_host, const GradientSegment& segment);
  // Calls visit(gradient, its host copy) for each parameter of the segment, last layer first.
  template <class Visit>
  void for_each_gradient(const GradientSegment& segment, Visit&& visit) const;

  vk::Context& context_;
  const LoopSettings& settings_;
  int64_t batch_;   // samples of a micro-batch, over all replicas
  BatchPart part_;  // this replica's of every training micro-batch
  bool replicated_;
  std::vector<GraphInput> staged_inputs_;
  size_t labels_input_ = 0, valid_input_ = 0;  // of staged_inputs_
  Network network_;
  Network::Layer& logits_;
  // Each loss layer with the weight of its term: "loss" (the logits') first, then the extra terms.
  std::vector<std::pair<Network::Layer*, float>> losses_;
  std::unique_ptr<Optimizer> optimizer_;

  int slots_ = 2;
  std::array<std::vector<StagedBatch>, 2> staging_;  // [slot][k]
  std::unique_ptr<Tensor> metrics_, step_, loss_scale_tensor_;
  std::map<const Tensor*, std::unique_ptr<Tensor>> host_gradients_;  // replicated: by gradient
  std::optional<LossScale> loss_scale_;  // mixed precision
  // Optimizer state per parameter, in the order of the network's parameters.
  std::map<std::string, std::vector<std::unique_ptr<Tensor>>> optimizer_states_;

  std::array<std::vector<MicroBatchPrograms>, 2> train_programs_;  // [slot][k]
  MicroBatchPrograms* recording_ = nullptr;                         // while record() runs
  StagedBatch* recording_staging_ = nullptr;
  std::array<std::unique_ptr<vk::Program>, 2> eval_programs_;
  std::vector<GradientSegment> segments_;  // replicated: of the last micro-batch's backward
  std::array<std::vector<std::unique_ptr<vk::Program>>, 2> backward_segments_;  // segments after the first
  std::unique_ptr<vk::Program> update_program_;
};

// Where the input `name` ("labels", "valid") sits among a training job's staged inputs.
size_t staged_input_index(const std::vector<GraphInput>& inputs, const std::string& name);

}  // namespace tessera
