// tessera forward: a model's logits for an HDF5 array of images, in eval mode.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>

#include "common/error.h"
#include "common/units.h"
#include "compute/inference.h"
#include "compute/vit.h"
#include "common/output.h"
#include "common/progress.h"
#include "common/run_summary.h"
#include "compute/checkpoint.h"
#include "compute/network.h"
#include "compute/tensor.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace tessera::cli {

namespace {

struct ForwardFlags {
  std::string model, encoder, input, output, precision = "fp32", memory_limit, weights;
  int batch = 16, device = -1, classes = 2;
  bool random_weights = false, overwrite = false;
};

// Every pixel finite before the device is touched (one NaN gives its image a row of NaN logits),
// and with fp16 activations finite as the upload's conversion (to_half) makes it.
void refuse_unusable_images(const HostArray& x, const ForwardFlags& f) {
  const int64_t height = x.shape[2], width = x.shape[3], per_image = x.shape[1] * height * width;
  for (int64_t image = 0; image < x.shape[0]; ++image) {
    std::span<const float> values(x.values.data() + image * per_image, static_cast<size_t>(per_image));
    const auto halves = f.precision == "fp16" ? to_half(values) : std::vector<uint16_t>();
    if (auto at = first_non_finite(values, halves)) {
      const auto i = static_cast<int64_t>(*at);
      throw BadInput(f.input + ": dataset x: image " + std::to_string(image) + " (channel " +
                     std::to_string(i / (height * width)) + ", y " + std::to_string(i / width % height) + ", x " +
                     std::to_string(i % width) + ") is " + format_number(static_cast<double>(values[*at])) +
                     (std::isfinite(values[*at]) ? ": --precision fp16 converts images to float16, whose largest "
                                                   "value is 65504 (give --precision fp32)"
                                                 : ": images must be finite") +
                     " (nothing was run or written)");
    }
  }
}

void run_forward(const ForwardFlags& f) {
  refuse_untrained_model(f.model, f.random_weights);
  refuse_output_over_inputs("--output", f.output, {{"--input", f.input}, {"--model", f.model}});
  OutputLock lock(f.output);
  check_replaceable(f.output, "--output", f.overwrite ? Existing::overwrite : Existing::refuse);
  HostArray x = read_hdf5_array(f.input, "x");
  if (x.shape.size() != 4 || x.shape[1] != 3)
    throw BadInput(f.input + ": dataset x must be float32 [N,3,H,W] (normalised images), got " + to_string(x.shape));
  if (x.shape[0] == 0) throw BadInput(f.input + ": dataset x holds no images (shape " + to_string(x.shape) + ")");
  refuse_unusable_images(x, f);
  const ResolvedModel model = resolve_model(f.model, f.classes, f.encoder);
  const int64_t n = x.shape[0], batch = std::min<int64_t>(f.batch, n);
  const int64_t per_image = x.shape[1] * x.shape[2] * x.shape[3];
  vk::ContextOptions options = vk::options_from_environment();
  options.device_index = f.device;
  if (!f.memory_limit.empty()) options.memory_budget = parse_bytes(f.memory_limit, "--device-memory-limit");
  vk::Context context(options);
  // In fp16 the images are converted as they are uploaded and every activation is fp16.
  const DType activations = f.precision == "fp16" ? DType::f16 : DType::f32;
  if (activations == DType::f16) require_fp16_storage(context.info(), "forward");
  InferenceOptions setup;
  setup.inputs = {{"input", {batch, 3, x.shape[2], x.shape[3]}, activations}};
  setup.input_memory = vk::MemoryUsage::device;
  setup.activations = activations;
  if (!f.encoder.empty() && fp16_weights(f.weights, activations == DType::f16)) {
    require_fp16_storage(context.info(), "forward", "--weights");
    setup.weights = DType::f16;
  }
  Inference network(context, model, setup);
  const Tensor& input = network.input("input");
  const int64_t classes = network.output_shape()[1];
  HostArray logits{{n, classes}, std::vector<float>(static_cast<size_t>(n * classes))};
  std::vector<float> chunk(static_cast<size_t>(batch * per_image));
  Progress progress("forward", static_cast<uint64_t>(n), "forward " + f.input);
  // The first batch also pays for one-off work (drivers that compile at first dispatch), so
  // the steady rate leaves it out.
  double device_seconds = 0, first_batch_seconds = 0;
  for (int64_t first = 0; first < n; first += batch) {
    int64_t count = std::min(batch, n - first);
    std::fill(chunk.begin(), chunk.end(), 0.0f);
    std::copy_n(x.values.begin() + first * per_image, count * per_image, chunk.begin());
    input.upload(chunk);
    auto start = std::chrono::steady_clock::now();
    network.run();
    device_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (first == 0) first_batch_seconds = device_seconds;
    auto out = network.output().download();
    if (auto at = first_non_finite(std::span<const float>(out.data(), static_cast<size_t>(count * classes)))) {
      const auto i = static_cast<int64_t>(*at);
      throw BadInput(f.input + ": dataset x: image " + std::to_string(first + i / classes) + ": logit " +
                     std::to_string(i % classes) + " is " + format_number(static_cast<double>(out[*at])) +
                     ": the model's output is not finite (the weights of " + model.source +
                     " or this image's values are out of range" +
                     (activations == DType::f16 ? ", or an fp16 activation passed 65504: try --precision fp32" : "") +
                     "); " + f.output + " is not written");
    }
    std::copy_n(out.begin(), count * classes, logits.values.begin() + first * classes);
    progress.update(static_cast<uint64_t>(first + count), {{"images/s", (first + count) / device_seconds}});
  }
  progress.finish();
  write_hdf5_arrays(f.output, {{"logits", logits}});
  nlohmann::json summary = {{"images", n},
                            {"batch", batch},
                            {"device", context.info().name},
                            {"precision", f.precision},
                            {"weights", setup.weights == DType::f16 ? "fp16" : "fp32"},
                            {"forward_seconds", device_seconds}, {"images_per_second", n / device_seconds},
                            {"planned_device_bytes", network.plan().total()},
                            {"peak_device_bytes", context.allocator().stats().peak_bytes}};
  if (n > batch) summary["steady_images_per_second"] = (n - batch) / (device_seconds - first_batch_seconds);
  print_result(summary, "logits: " + f.output + " (" + std::to_string(n) + " images x " + std::to_string(classes) +
                            " classes; " + std::to_string(std::llround(n / device_seconds)) + " images/s on " +
                            context.info().name + ")\n");
}

}  // namespace

void add_forward_command(CLI::App& app) {
  auto* command = app.add_subcommand("forward", "Logits of a model for float32 images [N,3,H,W] in an HDF5 file");
  auto flags = std::make_shared<ForwardFlags>();
  command->add_option("--model", flags->model, "Checkpoint .h5, preset, model JSON, or .safetensors (with --encoder)")
      ->required();
  command->add_option("--encoder", flags->encoder,
                      "The architecture of --model's weights: a ViT preset (" + vit_preset_list() +
                          "; TRIDENT's name in brackets) or a model JSON; timm's and torchvision's names are read");
  command->add_option("--input", flags->input, "HDF5 file with dataset x, float32 [N,3,H,W], normalised")->required();
  command->add_option("--output", flags->output, "HDF5 file to write dataset logits [N,K] to")->required();
  command->add_flag("--random-weights", flags->random_weights,
                    "Run a preset or model JSON with random weights (benchmarks); otherwise refused");
  command->add_flag("--overwrite", flags->overwrite, "Replace an existing --output (otherwise refused)");
  command->add_option("--classes", flags->classes, "Classes of a preset (not of a checkpoint)")->capture_default_str();
  command->add_option("--batch", flags->batch, "Images per dispatch")->capture_default_str()->check(cli::at_least(1));
  command->add_option("--device", flags->device, "Vulkan device index");
  command->add_option("--device-memory-limit", flags->memory_limit,
                      "Device memory budget, e.g. 2GiB; a plan over it is exit 3 before any work");
  command->add_option("--precision", flags->precision,
                      "fp32, or fp16 activations (a model's weights stay fp32; an encoder's follow --weights)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "fp16"}));
  add_weights_flag(*command, flags->weights);
  command->callback([command, flags] {
    if (command->count("--weights") && flags->encoder.empty())
      throw UsageError("--weights is for --encoder: a model's weights stay fp32");
    // Refused before anything is read.
    fp16_weights(flags->weights, flags->precision == "fp16");
    run_forward(*flags);
  });
}

}  // namespace tessera::cli
