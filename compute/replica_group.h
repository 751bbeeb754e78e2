// The replicas of a data-parallel run that this process holds (one per device; a device may be
// opened twice), and what makes them one model with the other processes' (compute/data_parallel.h):
// each micro-batch split over the replicas in order, batch norm moments merged under --sync-bn,
// gradients summed segment by segment (and all-reduced over MPI) while later segments run,
// metrics summed, rank 0's state broadcast. Alone, a group of one replica does none of this.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/replica.h"

namespace tessera {

class ReplicaGroup {
 public:
  // Throws UsageError when the micro-batch cannot give every replica a sample, or --sync-bn has
  // nothing to combine.
  ReplicaGroup(const std::vector<vk::Context*>& devices, const LoopSettings& settings, const TrainingJob& job);

  bool replicated() const { return replicas_in_job_ > 1; }
  int replicas_in_job() const { return replicas_in_job_; }
  Replica& first() { return *replicas_.front(); }
  std::vector<std::unique_ptr<Replica>>& replicas() { return replicas_; }
  Processes& processes() { return processes_; }

  // A plan per device, in the order the run allocates: each replica's, and on the first device
  // the whole micro-batch that the Feed writes before the replicas take their parts.
  std::vector<MemoryPlan> plans() const;
  void allocate();
  // Of every replica (Replica::set_staging_slots): the slot of step s is s % staging_slots().
  int staging_slots() const { return replicas_.front()->staging_slots(); }

  // Where the Feed writes micro-batch k of `slot`: the replica's own staging alone, else the
  // whole micro-batch, which distribute() then splits.
  std::map<std::string, const Tensor*> feed_target(int slot, int k);
  // Copies each replica's part of the whole micro-batch into its slot: in training the fixed
  // part its network was built for, with the weight of its samples' losses; in evaluation the
  // valid samples split again, so a short last batch spreads over the replicas too.
  void distribute(int slot, int k, bool training);
  // Submits micro-batch k of `slot` on every replica; with --sync-bn, part by part, combining
  // the replicas' values at each exchange before the next part starts.
  void run_micro_batch(int slot, size_t k);
  // Replicated: sums the gradients of the step in `slot` segment by segment, as each finishes on
  // every replica (while the later segments run), then starts every replica's update.
  void exchange_gradients(int slot);
  // Host time and bytes (per replica) of the gradient sums since the last reset.
  double exchange_seconds = 0;
  uint64_t exchange_bytes = 0;

  void wait_all();
  void reset_metrics();
  // The metrics summed over every replica of the job.
  std::array<double, 3> read_metrics();
  // Every replica takes rank 0's first replica's running statistics (as PyTorch DDP broadcasts
  // rank 0's buffers), which is also what checkpoints keep.
  void broadcast_state();
  // The largest difference between a parameter of any replica and rank 0's first replica's:
  // zero while every replica runs the same update on the same summed gradient.
  double replica_weight_difference(const std::map<std::string, HostArray>& params);
  // The most any one device of the job has held.
  uint64_t peak_device_bytes();
  // Every process's validation scores, on every process.
  BinaryScores gather_scores(const BinaryScores& mine);
  // Processes that disagree on the number of collectives to come would wait for each other
  // forever: each one's steps, validation batches, first epoch and gradient size must match.
  void check_processes_agree(const std::vector<double>& counts);

 private:
  // Exchange p of micro-batch k over every replica of the job, in double on the host.
  void combine(int slot, size_t k, size_t p);

  const LoopSettings& settings_;
  const TrainingJob& job_;
  Processes& processes_;
  int64_t batch_ = 0;  // samples of a micro-batch, over all replicas
  int replicas_in_job_ = 1;
  std::vector<std::unique_ptr<Replica>> replicas_;  // this process's, in device order
  // Replicated: the whole micro-batch, in TrainingJob::staged's order.
  std::vector<std::unique_ptr<Tensor>> whole_;
  size_t labels_input_ = 0, valid_input_ = 0;  // of TrainingJob::staged
};

}  // namespace tessera
