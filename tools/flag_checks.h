// Checks for numeric flags. CLI11's own Range prints its bounds with 17 digits and lets NaN
// through (every comparison with NaN is false), so tessera's commands use these instead.
#pragma once
#include <CLI/CLI.hpp>

#include <limits>
#include <string>
#include <vector>

namespace tessera {
enum class WeightStreaming;  // compute/inference.h
}

namespace tessera::cli {

// A finite number in [low, high]; the message names the range as written ("in [0, 1]").
CLI::Validator finite_in(double low, double high);

// A finite number above zero.
CLI::Validator finite_positive();

// A finite number, `low` or above ("0 is out of range: at least 1").
inline CLI::Validator at_least(double low) { return finite_in(low, std::numeric_limits<double>::max()); }

// A finite number, zero or above.
inline CLI::Validator finite_non_negative() { return at_least(0); }

// A flag naming a path the run reads, for refuse_output_over_inputs.
struct InputPath {
  std::string flag;  // "--data"
  std::string path;
};

// Throws UsageError (exit 2) when `output` is one of the inputs, or lies inside an input
// directory: compared by filesystem identity (links, "./" and hard links included), not by text.
void refuse_output_over_inputs(const std::string& output_flag, const std::string& output,
                               const std::vector<InputPath>& inputs);

// Throws UsageError (exit 2) when `model` is a preset or a model JSON (random weights) and
// the user did not ask for random weights with --random-weights: features or logits of an
// untrained model are noise that looks like a result.
void refuse_untrained_model(const std::string& model, bool random_weights);

// --weights fp16|bf16|fp32: how an encoder's large weights are stored on the device. Adds the
// option (its value in `weights`, empty when not given).
CLI::Option* add_weights_flag(CLI::App& command, std::string& weights);

// --stream-weights auto|on|off: whether an encoder's transformer blocks' weights stay in host
// memory and reach the device a group of blocks at a time. Adds the option (its value in
// `streaming`, "auto" unless given).
CLI::Option* add_stream_weights_flag(CLI::App& command, std::string& streaming);

// The WeightStreaming of --stream-weights' value.
WeightStreaming weight_streaming(const std::string& streaming);

// Whether the weights are stored in fp16: as given, else as --precision (fp16 under fp16, fp32
// otherwise). bf16 is a UsageError (exit 2) naming --weights: no kernel of tessera computes with
// bf16 weights (lavapipe has no bf16 arithmetic, nor GLSL a bf16 type without extensions); the
// message says what runs instead (a bf16 .safetensors file is read as it comes by either).
bool fp16_weights(const std::string& weights, bool fp16_precision);

}  // namespace tessera::cli
