// What the host's cores can do at best, the ceilings that a CPU device's kernels (lavapipe) are
// judged against: single-precision FMA throughput per core and all cores together, and memory
// bandwidth of a copy far larger than the last-level cache, on 1 thread and on every core.
// Prints one JSON object. No device: lavapipe's kernels run on these same cores.
//
// The FMA loop keeps 12 independent accumulator vectors (more than an FMA's latency times the
// FMA pipes, so the pipes never wait) of 8 floats (AVX2), the width llvmpipe compiles for.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs body(thread) on `threads` threads at once and returns the wall seconds of the slowest.
template <class Body>
double timed_on_threads(int threads, Body body) {
  std::vector<std::thread> workers;
  auto start = Clock::now();
  for (int t = 0; t < threads; ++t) workers.emplace_back(body, t);
  for (auto& w : workers) w.join();
  return seconds_since(start);
}

#if defined(__x86_64__)
typedef float Vec8 __attribute__((vector_size(32)));

// `iterations` x 12 FMAs of 8 lanes; returns a sum so that nothing is optimised away.
__attribute__((target("avx2,fma"))) float fma_loop(long iterations, float seed) {
  constexpr int kChains = 12;
  Vec8 acc[kChains];
  Vec8 scale, shift;
  for (int lane = 0; lane < 8; ++lane) {
    scale[lane] = 0.999999f;
    shift[lane] = seed * 1e-7f;
  }
  for (int c = 0; c < kChains; ++c)
    for (int lane = 0; lane < 8; ++lane) acc[c][lane] = seed + static_cast<float>(c + lane);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12  // unrolled, the accumulators stay in registers
    for (int c = 0; c < kChains; ++c) acc[c] = __builtin_ia32_vfmaddps256(acc[c], scale, shift);
  float sum = 0;
  for (int c = 0; c < kChains; ++c)
    for (int lane = 0; lane < 8; ++lane) sum += acc[c][lane];
  return sum;
}
constexpr double kFlopsPerIteration = 12 * 8 * 2;
#endif

// Best GFLOPS of `rounds` runs of the FMA loop on `threads` threads at once.
double fma_gflops(int threads, long iterations, int rounds) {
#if defined(__x86_64__)
  std::vector<float> sink(static_cast<size_t>(threads));
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    double seconds = timed_on_threads(threads, [&](int t) { sink[static_cast<size_t>(t)] = fma_loop(iterations, 1.0f + t); });
    best = std::max(best, threads * iterations * kFlopsPerIteration / seconds / 1e9);
  }
  if (sink[0] == 12345.0f) std::printf("%g\n", static_cast<double>(sink[0]));
  return best;
#else
  (void)threads, (void)iterations, (void)rounds;
  return 0;
#endif
}

// Best GB/s (bytes read plus bytes written) of copying `bytes` per thread on `threads` threads,
// each its own buffers, over `rounds` runs; the first touch of every page is before the clock.
double copy_gbytes_per_second(int threads, size_t bytes, int rounds) {
  std::vector<std::vector<char>> from(static_cast<size_t>(threads)), to(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    from[static_cast<size_t>(t)].assign(bytes, static_cast<char>(t + 1));
    to[static_cast<size_t>(t)].assign(bytes, 0);
  }
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    double seconds = timed_on_threads(threads, [&](int t) {
      std::memcpy(to[static_cast<size_t>(t)].data(), from[static_cast<size_t>(t)].data(), bytes);
    });
    best = std::max(best, 2.0 * static_cast<double>(bytes) * threads / seconds / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"FMA throughput and copy bandwidth of the host's cores (JSON on stdout)"};
  int rounds = 5;
  size_t mebibytes = 256;
  long iterations = 50'000'000;
  app.add_option("--rounds", rounds, "runs of each measurement; the best is kept")->check(CLI::Range(1, 1000));
  app.add_option("--copy-mib", mebibytes, "bytes each thread copies, MiB (well past the last-level cache)")
      ->check(CLI::Range(1, 16384));
  app.add_option("--fma-iterations", iterations, "iterations of the FMA loop (12 vector FMAs each)")
      ->check(CLI::Range(1000L, 100'000'000'000L));
  CLI11_PARSE(app, argc, argv);
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_t bytes = mebibytes << 20;
  nlohmann::json result{{"threads_available", cores},
                        {"fma_vector_floats", 8},
                        {"fma_gflops_one_core", fma_gflops(1, iterations, rounds)},
                        {"fma_gflops_all_cores", fma_gflops(cores, iterations, rounds)},
                        {"copy_bytes_per_thread", bytes},
                        {"copy_gbytes_per_second_one_thread", copy_gbytes_per_second(1, bytes, rounds)},
                        {"copy_gbytes_per_second_all_cores", copy_gbytes_per_second(cores, bytes, rounds)}};
  std::printf("%s\n", result.dump(2).c_str());
}
