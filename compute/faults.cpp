#include "compute/faults.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "common/error.h"
#include "common/units.h"
#include "compute/release_wait.h"
#include "compute/tensor.h"
#include "compute/vk/memory.h"

namespace tessera {

namespace {

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

}  // namespace

Faults Faults::from_environment() {
  Faults faults;
  const char* variable = std::getenv("TESSERA_FAULT");
  if (!variable) return faults;
  std::string fault = variable;
  if (starts_with(fault, "leak:")) {
    faults.leak_bytes = parse_bytes(fault.substr(5), "TESSERA_FAULT=leak");
  } else if (fault == "segfault") {
    faults.segfault = true;
  } else if (fault == "hang") {
    faults.hang = true;
  } else if (fault == "oom") {
    faults.oom = true;
  } else if (starts_with(fault, "wait:")) {
    faults.wait = fault.substr(5);
  } else if (fault == "nan" || starts_with(fault, "nan:")) {
    faults.nan_tensor = fault == "nan" ? std::string() : fault.substr(4);
  } else if (int epoch = 0, rank = -1; std::sscanf(fault.c_str(), "sigkill:%d:%d", &epoch, &rank) >= 1) {
    faults.sigkill_epoch = epoch;
    faults.sigkill_rank = rank;
  } else if (starts_with(fault, "loss_scale:")) {
    faults.loss_scale = std::strtof(fault.c_str() + 11, nullptr);
  } else if (fault != "skip_flush") {  // skip_flush: vk::Allocator reads it
    throw UsageError("TESSERA_FAULT=" + fault +
                     ": not a fault (leak:BYTES, segfault, hang, oom, nan, nan:TENSOR, wait:DIR, sigkill:EPOCH[:RANK], "
                     "loss_scale:VALUE, skip_flush)");
  }
  return faults;
}

void Faults::before_training(vk::Context& context) const {
  if (leak_bytes) {
    // Deliberately never freed: in one process (the sweep's --isolation none) leaks add up.
    (void)new Tensor(context, "leaked by TESSERA_FAULT", {static_cast<int64_t>(*leak_bytes / 4)});
  } else if (segfault) {
    std::raise(SIGSEGV);
  } else if (hang) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  } else if (oom) {
    Tensor too_big(context, "TESSERA_FAULT=oom", {static_cast<int64_t>(context.allocator().stats().budget_bytes / 4 + 1)});
  } else if (wait) {
    wait_for_release(*wait);
  }
}

void Faults::after_epoch(int epochs_done, int rank) const {
  if (sigkill_epoch == epochs_done && (sigkill_rank < 0 || sigkill_rank == rank)) std::raise(SIGKILL);
}

}  // namespace tessera
