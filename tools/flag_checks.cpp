#include "tools/flag_checks.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "common/error.h"
#include "compute/checkpoint.h"
#include "compute/inference.h"
#include "compute/safetensors.h"

namespace tessera::cli {

namespace {

// The number in `text`, or NaN when it is none.
double parse_number(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  return (end == text.c_str() || *end != '\0') ? std::nan("") : value;
}

std::string bound(double value) {
  if (value >= std::numeric_limits<double>::max()) return "inf";
  return CLI::detail::to_string(value);
}

}  // namespace

CLI::Validator finite_in(double low, double high) {
  std::string range = "[" + bound(low) + ", " + bound(high) + "]";
  if (high >= std::numeric_limits<double>::max()) range = "at least " + bound(low);
  return CLI::Validator(
      [low, high, range](std::string& text) -> std::string {
        double value = parse_number(text);
        if (!std::isfinite(value)) return text + " is not a finite number";
        if (value < low || value > high) return text + " is out of range: " + range;
        return {};
      },
      range);
}

CLI::Validator finite_positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = parse_number(text);
        if (!std::isfinite(value)) return text + " is not a finite number";
        if (value <= 0) return text + " is out of range: above 0";
        return {};
      },
      "above 0");
}

namespace {

// Whether `inner` (a path without "..") is `outer` or lies inside the directory `outer`.
bool same_or_inside(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  std::error_code error;
  if (!std::filesystem::exists(outer, error)) return false;
  for (auto at = inner; !at.empty(); at = at.parent_path()) {
    if (std::filesystem::exists(at, error) && std::filesystem::equivalent(at, outer, error)) return true;
    if (at == at.parent_path()) break;
  }
  return false;
}

}  // namespace

void refuse_output_over_inputs(const std::string& output_flag, const std::string& output,
                               const std::vector<InputPath>& inputs) {
  if (output.empty()) return;
  std::error_code error;
  auto resolved = std::filesystem::weakly_canonical(std::filesystem::absolute(output), error);
  for (auto& input : inputs) {
    if (input.path.empty()) continue;
    if (same_or_inside(resolved, std::filesystem::absolute(input.path)))
      throw UsageError(output_flag + " " + output + " is the input " + input.flag + " " + input.path +
                       ": the run would overwrite it; write elsewhere");
  }
}

void refuse_untrained_model(const std::string& model, bool random_weights) {
  if (random_weights || is_checkpoint_path(model) || is_safetensors_path(model)) return;
  throw UsageError("--model " + model +
                   " has random weights (a preset or a model description, not a checkpoint .h5 or .safetensors "
                   "weights): give trained weights, or --random-weights to run it untrained on purpose");
}

CLI::Option* add_weights_flag(CLI::App& command, std::string& weights) {
  return command
      .add_option("--weights", weights,
                  "An encoder's weights on the device: fp16 (linear and convolution weights and position "
                  "embeddings in half the memory, converted once as they load; sums stay fp32) or fp32; default "
                  "fp16 with --precision fp16, else fp32. A weight past fp16's 65504 is exit 5 naming it. bf16: "
                  "exit 2, no kernel computes with it (bf16 files are read as they come either way)")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
}

CLI::Option* add_stream_weights_flag(CLI::App& command, std::string& streaming) {
  streaming = "auto";
  return command
      .add_option("--stream-weights", streaming,
                  "An encoder's transformer blocks' weights kept in host memory and copied to the device a group of "
                  "blocks at a time as each batch runs: auto (where the weights and the batch do not fit the "
                  "device's budget), on or off; the plan says whether it streams")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
}

WeightStreaming weight_streaming(const std::string& streaming) {
  return streaming == "on" ? WeightStreaming::on : streaming == "off" ? WeightStreaming::off : WeightStreaming::automatic;
}

bool fp16_weights(const std::string& weights, bool fp16_precision) {
  if (weights == "bf16")
    throw UsageError("--weights bf16: tessera has no kernel that computes with bf16 weights (nor does lavapipe "
                     "bf16 arithmetic); give --weights fp16 (half the memory of fp32, as bf16) or fp32. A bf16 "
                     ".safetensors file (UNI2-h's) is read as it comes either way, each value converted once as it "
                     "loads; one past fp16's 65504 is refused by name under fp16");
  return weights.empty() ? fp16_precision : weights == "fp16";
}

}  // namespace tessera::cli
