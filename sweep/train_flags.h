// The `train` flags a sweep passes: checked against train's own flag definitions (the tools layer
// reads them from the CLI11 app that `tessera train` parses with), given each trial's number for
// `{trial}`, and edited for --oom-retry (--batch, --accumulate) and --devices (--device).
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "sweep/space.h"

namespace tessera::sweep {

struct TrainFlags {
  std::set<std::string> names;                  // "--lr", "-h" ...
  std::map<std::string, std::string> defaults;  // "--batch" -> "32" where train has one
};

// Throws UsageError for a fixed flag or a --param that `train` does not have, a flag both
// fixed and searched, one the sweep sets itself (--report-fd; --device with --devices), or a
// fixed --checkpoint without {trial} that several trials would share.
void check_train_flags(const TrainFlags& known, const std::vector<std::string>& fixed, const SearchSpace& space,
                       bool sweep_sets_device, int trials);

// Every `{trial}` in the tokens replaced by the trial's number (runs/{trial}.h5 -> runs/7.h5).
std::vector<std::string> with_trial_number(std::vector<std::string> tokens, int number);

// The value of `flag` in `tokens` ("--batch 32" or "--batch=32"), the last one if repeated.
std::optional<std::string> flag_value(const std::vector<std::string>& tokens, std::string_view flag);
// Replaces the value of `flag` in `tokens`, or appends the flag.
void set_flag(std::vector<std::string>& tokens, std::string_view flag, const std::string& value);

}  // namespace tessera::sweep
