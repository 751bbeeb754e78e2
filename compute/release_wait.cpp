#include "compute/release_wait.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.h"

namespace tessera {

void wait_for_release(const std::string& directory) {
  const char* trial = std::getenv("TESSERA_TRIAL");
  if (!trial) throw UsageError("TESSERA_FAULT=wait:DIR needs TESSERA_TRIAL (set by tessera sweep)");
  std::filesystem::path dir(directory);
  auto started = dir / ("started-" + std::string(trial));
  std::ofstream(started.string() + ".partial") << getpid() << "\n";
  std::filesystem::rename(started.string() + ".partial", started);  // whole, or not there
  while (!std::filesystem::exists(dir / ("go-" + std::string(trial))))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace tessera
