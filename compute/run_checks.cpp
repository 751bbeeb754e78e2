#include "compute/run_checks.h"

#include <cmath>

#include "common/error.h"

namespace tessera {

void check_finite_state(const std::map<std::string, HostArray>& params, const std::map<std::string, HostArray>& train,
                        int epoch) {
  for (auto* group : {&params, &train})
    for (auto& [name, array] : *group)
      for (float value : array.values)
        if (!std::isfinite(value))
          throw Diverged("training diverged: " + name + " holds " + (std::isnan(value) ? "NaN" : "an infinity") +
                         " after epoch " + std::to_string(epoch) +
                         " (try a lower --lr); the checkpoint keeps its last finite state");
}

}  // namespace tessera
