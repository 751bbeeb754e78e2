// Data-parallel training: how a batch is split over replicas (Vulkan devices in this process,
// times the processes of an MPI job), and the collectives that keep the replicas one model:
// gradients summed through host memory, metrics summed, rank 0's state broadcast.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// The samples of a batch of `n` that replica `replica` of `replicas` takes, in order:
// n / replicas, and one more for each of the first n % replicas replicas, so that no sample is
// dropped or taken twice whatever n.
struct BatchPart {
  int64_t first = 0, count = 0;
};
BatchPart batch_part(int64_t n, int replica, int replicas);

// The processes of the job: an MPI world when this process was started by a launcher
// (common/mpi_launcher.h), else this process alone, with MPI never initialised (the sweep's
// trials and plain runs).
class Processes {
 public:
  // Initialises MPI on the first call in a launched process.
  static Processes& world();
  bool launched() const { return launched_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The rank among the job's processes on this machine: the device it takes by default.
  int local_rank() const { return local_rank_; }

  // Collectives over every process (no-ops alone); each process must call them in the same order.
  void sum(std::span<float> values);
  void sum(std::span<double> values);
  void max(std::span<double> values);
  void broadcast(void* data, size_t bytes);  // from rank 0
  // Every process's bytes, concatenated in rank order, on every process.
  std::vector<uint8_t> gather(std::span<const uint8_t> bytes);
  // Ends MPI after a run that succeeded on every process (a failing process exits without it,
  // and the launcher then ends the others).
  void finish();

 private:
  Processes();
  bool launched_ = false, finished_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
};

// Sums the replicas' gradients in place: `copies[r]` is replica r's host-visible copy of all
// its gradients, one after another; afterwards every copy holds the sum over the replicas of
// this process and of every other process. The sum goes in buckets of `bucket_bytes`, each
// all-reduced over the processes as soon as its local sum is done.
void sum_gradients(const std::vector<std::span<float>>& copies, Processes& processes,
                   size_t bucket_bytes = size_t{4} << 20);

}  // namespace tessera
