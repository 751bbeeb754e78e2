// Checks the training loop makes on what it is about to save; kept apart from the loop so that
// it calls each in one line.
#pragma once
#include <map>
#include <string>

#include "compute/checkpoint.h"

namespace tessera {

// Throws Diverged (exit 4) naming the first parameter or optimizer state that holds NaN or an
// infinity after `epoch`: a diverged run must not pass for a trained one, nor replace the last
// good checkpoint.
void check_finite_state(const std::map<std::string, HostArray>& params, const std::map<std::string, HostArray>& train,
                        int epoch);

}  // namespace tessera
