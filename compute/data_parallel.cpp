#include "compute/data_parallel.h"

// The C API only: OpenMPI's header would otherwise pull in its deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/mpi_launcher.h"

namespace tessera {

BatchPart batch_part(int64_t n, int replica, int replicas) {
  int64_t base = n / replicas, extra = n % replicas;
  return {replica * base + std::min<int64_t>(replica, extra), base + (replica < extra ? 1 : 0)};
}

namespace {

bool started_by_launcher() {
  for (auto& variable : mpi_launcher_variables())
    if (std::getenv(variable.c_str())) return true;
  return false;
}

void check_mpi(int result, const char* what) {
  if (result == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(result, text, &length);
  throw std::runtime_error(std::string(what) + ": " + std::string(text, static_cast<size_t>(length)));
}

// MPI counts are ints: long arrays go in pieces.
template <class Call>
void in_pieces(size_t count, Call call) {
  constexpr size_t kPiece = size_t{1} << 30;
  for (size_t first = 0; first < count; first += kPiece) call(first, static_cast<int>(std::min(kPiece, count - first)));
}

}  // namespace

Processes::Processes() {
  if (!started_by_launcher()) return;
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  // Errors come back as codes (and become exceptions) rather than aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  launched_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm machine;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &machine),
            "MPI_Comm_split_type");
  MPI_Comm_rank(machine, &local_rank_);
  MPI_Comm_free(&machine);
}

Processes& Processes::world() {
  static Processes processes;
  return processes;
}

void Processes::sum(std::span<float> values) {
  if (!launched_) return;
  in_pieces(values.size(), [&](size_t first, int count) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data() + first, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce");
  });
}

void Processes::sum(std::span<double> values) {
  if (!launched_) return;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                          MPI_COMM_WORLD),
            "MPI_Allreduce");
}

void Processes::max(std::span<double> values) {
  if (!launched_) return;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX,
                          MPI_COMM_WORLD),
            "MPI_Allreduce");
}

void Processes::broadcast(void* data, size_t bytes) {
  if (!launched_) return;
  in_pieces(bytes, [&](size_t first, int count) {
    check_mpi(MPI_Bcast(static_cast<uint8_t*>(data) + first, count, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
  });
}

std::vector<uint8_t> Processes::gather(std::span<const uint8_t> bytes) {
  if (!launched_) return {bytes.begin(), bytes.end()};
  int mine = static_cast<int>(bytes.size());
  std::vector<int> counts(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  int total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    offsets[r] = total;
    total += counts[r];
  }
  std::vector<uint8_t> all(static_cast<size_t>(total));
  check_mpi(MPI_Allgatherv(bytes.data(), mine, MPI_BYTE, all.data(), counts.data(), offsets.data(), MPI_BYTE,
                           MPI_COMM_WORLD),
            "MPI_Allgatherv");
  return all;
}

void Processes::finish() {
  if (!launched_ || finished_) return;
  finished_ = true;
  MPI_Finalize();
}

void sum_gradients(const std::vector<std::span<float>>& copies, Processes& processes, size_t bucket_bytes) {
  if (copies.empty()) return;
  std::span<float> total = copies[0];
  size_t bucket = std::max<size_t>(1, bucket_bytes / sizeof(float));
  for (size_t begin = 0; begin < total.size(); begin += bucket) {
    std::span<float> sum = total.subspan(begin, std::min(bucket, total.size() - begin));
    for (size_t r = 1; r < copies.size(); ++r) {
      const float* other = copies[r].data() + begin;
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += other[i];
    }
    processes.sum(sum);
    for (size_t r = 1; r < copies.size(); ++r) std::copy(sum.begin(), sum.end(), copies[r].begin() + static_cast<std::ptrdiff_t>(begin));
  }
}

}  // namespace tessera
