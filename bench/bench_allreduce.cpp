// Throughput of the gradient all-reduce of data-parallel training (compute/data_parallel.h) on
// host buffers, apart from any training: the bytes of one replica's gradients summed per second,
// over `replicas` copies in this process and, under mpirun, over the ranks (MPI_Allreduce in
// 4 MiB buckets). Prints one JSON object (rank 0 under mpirun).
// Run: build/bench/bench_allreduce [MiB=64] [replicas=2]
//      mpirun -np 2 --oversubscribe build/bench/bench_allreduce 64 1
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/data_parallel.h"

using namespace tessera;

int main(int argc, char** argv) {
  size_t mebibytes = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  int replicas = argc > 2 ? std::atoi(argv[2]) : 2;
  Processes& processes = Processes::world();
  size_t floats = (mebibytes << 20) / sizeof(float);
  std::vector<std::vector<float>> buffers(static_cast<size_t>(replicas), std::vector<float>(floats, 1.0f));
  std::vector<std::span<float>> copies;
  for (auto& buffer : buffers) copies.emplace_back(buffer);
  sum_gradients(copies, processes);  // warm-up: pages touched, connections up
  int runs = 0;
  auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  while (runs < 5 || seconds < 1.0) {
    sum_gradients(copies, processes);
    ++runs;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double slowest = seconds;  // every rank runs as many rounds as the slowest needs
    processes.max(std::span<double>(&slowest, 1));
    seconds = slowest;
  }
  if (processes.rank() == 0)
    std::printf("%s\n", nlohmann::json{{"benchmark", "gradient_allreduce"},
                                       {"bytes", floats * sizeof(float)},
                                       {"replicas_per_process", replicas},
                                       {"processes", processes.size()},
                                       {"bytes_per_second", static_cast<double>(floats * sizeof(float)) * runs / seconds}}
                            .dump()
                            .c_str());
  processes.finish();
  return 0;
}
