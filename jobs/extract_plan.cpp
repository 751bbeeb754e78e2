#include "jobs/extract_plan.h"

#include <memory>

#include "common/error.h"
#include "common/run_summary.h"
#include "common/units.h"
#include "compute/memory_plan.h"

namespace tessera {

// The pass of an extraction over a batch of uint8 RGB tiles as the store holds them, which the
// prologue turns into the layer the model reads as "input".
InferenceOptions extraction_inference(const ExtractOptions &options, const ExtractModel &model) {
  InferenceOptions inference;
  inference.inputs = {{"images", {options.batch, model.input_size, model.input_size, model.channels}, DType::u8}};
  inference.prologue = model.encoder ? model.encoder->prologue()
                                     : nlohmann::json::array({{{"name", "input"}, {"type", "input_normalize"}, {"inputs", {"images"}}}});
  inference.layer = options.layer;
  if (model.encoder && options.fp16) inference.activations = DType::f16;
  if (model.encoder && options.fp16_weights) inference.weights = DType::f16;
  inference.stream_weights = model.encoder ? options.stream_weights : WeightStreaming::off;
  inference.advice = "lower --batch, or raise --device-memory-limit";
  inference.weights_digest = true;
  return inference;
}

// --batch, or less where a buffer of the pass would be larger than the device's largest (its
// maxStorageBufferRange: 128 MiB on lavapipe); `capped` then says so.
int64_t capped_batch(const ResolvedModel &model, const InferenceOptions &inference, const vk::DeviceInfo &device,
                     int64_t batch, nlohmann::json &capped) {
  BatchLimit limit = batch_within(model, inference, batch, device.largest_buffer);
  std::string bound = device.name + "'s largest storage buffer (maxStorageBufferRange) is " +
                      format_bytes(device.largest_buffer);
  if (limit.batch < 1)
    throw OutOfDeviceMemory("--model " + model.source + ": " + limit.buffer + " takes " + format_bytes(limit.bytes) +
                            " for one tile; " + bound);
  if (limit.batch < batch)
    capped = {{"warning", "--batch " + std::to_string(batch) + " capped to " + std::to_string(limit.batch) + ": at " +
                              std::to_string(batch) + ", " + limit.buffer + " would take " +
                              format_bytes(limit.bytes) + "; " + bound},
              {"requested_batch", batch},
              {"batch", limit.batch},
              {"largest_buffer", device.largest_buffer}};
  return limit.batch;
}

BatchChoice chosen_extraction_batch(const ExtractOptions &options, const ExtractModel &model, vk::Context &context,
                                    uint64_t budget) {
  InferenceOptions inference = extraction_inference(options, model);
  nlohmann::json capped;
  const int64_t cap = batch_speed_cap(context.info(), int64_t{model.input_size} * model.input_size);
  inference.inputs[0].shape[0] = cap;
  const int64_t largest = capped_batch(model.resolved, inference, context.info(), cap, capped);
  const auto share = static_cast<uint64_t>(static_cast<double>(budget) * chosen_batch_budget_share);
  return choose_batch(cap, largest, share, [&](int64_t batch) {
    inference.inputs[0].shape[0] = batch;
    return plan_inference(context, model.resolved, inference).device_bytes(context.allocator());
  });
}

vk::ContextOptions extraction_context(const ExtractOptions &options, int device) {
  vk::ContextOptions context = vk::options_from_environment();
  context.device_index = device;
  context.memory_budget = options.memory_budget;
  return context;
}

nlohmann::json device_extraction_plans(vk::Context &context, const ExtractOptions &options,
                                      const std::vector<ExtractModel> &models, std::vector<MemoryPlan> &plans) {
  // with_streaming: whether it streams, and how (a model's plan; the sum of several says nothing of it).
  auto describe = [](const MemoryPlan &plan, bool with_streaming = true) {
    if (!with_streaming)
      return nlohmann::json{{"bytes", plan.bytes}, {"total", plan.total()}, {"readable", format_bytes(plan.total())}};
    const MemoryPlan::Streaming &streaming = plan.streaming;
    auto resident = [&](const char *category) { return plan.bytes.count(category) ? plan.bytes.at(category) : 0; };
    return nlohmann::json{{"bytes", plan.bytes},
                          {"total", plan.total()},
                          {"readable", format_bytes(plan.total())},
                          {"streams_weights", streaming.groups > 0},
                          {"streaming",
                           {{"groups", streaming.groups},
                            {"blocks_per_group", streaming.blocks_per_group},
                            {"ring_slots", streaming.slots},
                            {"streamed_bytes", streaming.streamed_bytes},
                            {"resident_weight_bytes", resident("parameters") + resident("prepared weights")}}}};
  };
  const uint64_t budget = context.allocator().stats().budget_bytes;
  nlohmann::json model_reports = nlohmann::json::array();
  MemoryPlan together;
  for (const ExtractModel &model : models) {
    InferenceOptions requested = extraction_inference(options, model);
    nlohmann::json capped, chosen;
    int64_t batch = options.batch;
    if (batch == 0) {  // no --batch: the plan's choice, the models sharing the budget
      const BatchChoice choice = chosen_extraction_batch(options, model, context, budget / models.size());
      batch = choice.batch;
      chosen = choice.to_json();
    }
    requested.inputs[0].shape[0] = batch;
    InferenceOptions inference = requested;
    inference.inputs[0].shape[0] = capped_batch(model.resolved, requested, context.info(), batch, capped);
    const MemoryPlan &plan = plans.emplace_back(plan_inference(context, model.resolved, inference));
    together.append(plan);
    model_reports.push_back({{"model", model.name},
                             {"plan_at_requested_batch", describe(plan_inference(context, model.resolved, requested))},
                             {"batch", inference.inputs[0].shape[0]},
                             {"batch_capped", capped},
                             {"batch_chosen", chosen},
                             {"plan", describe(plan)},
                             {"fits", plan.fits(context)}});
  }
  nlohmann::json report = model_reports.front();  // the first model's, where a script looks
  report.update({{"index", context.info().index},
                 {"name", context.info().name},
                 {"budget_bytes", budget},
                 {"models", model_reports},
                 {"together", describe(together, false)},
                 {"models_together", together.device_bytes(context.allocator()) <= budget}});
  return report;
}

namespace {

// The plans of print_extraction_plans as a person reads them: per device and model, the batch
// and why, each category's bytes, the total and whether it fits.
std::string extraction_plan_text(const nlohmann::json &summary) {
  std::string text;
  // "    activations             34.6 MiB": a label and its bytes, aligned.
  auto bytes_row = [](const std::string &label, uint64_t bytes) {
    return "    " + label + std::string(label.size() < 24 ? 24 - label.size() : 1, ' ') + format_bytes(bytes);
  };
  for (const nlohmann::json &device : summary["devices"]) {
    text += "Device memory plan on " + device["name"].get<std::string>() + " (device " + format_number(device["index"]) +
            ", budget " + format_bytes(device["budget_bytes"].get<uint64_t>()) + "), " +
            summary["precision"].get<std::string>() + "\n";
    for (const nlohmann::json &model : device["models"]) {
      text += "  " + model["model"].get<std::string>() + " at batch " + format_number(model["batch"]);
      if (model["batch_capped"].is_object()) text += ": " + model["batch_capped"]["warning"].get<std::string>();
      else if (model["batch_chosen"].is_object()) text += ": " + model["batch_chosen"]["why"].get<std::string>();
      text += "\n";
      for (auto &[category, bytes] : model["plan"]["bytes"].items()) text += bytes_row(category, bytes.get<uint64_t>()) + "\n";
      if (const nlohmann::json &streaming = model["plan"]["streaming"]; model["plan"]["streams_weights"].get<bool>())
        text += "    streams the weights of " + format_number(streaming["groups"]) + " groups of " +
                format_number(streaming["blocks_per_group"]) + " blocks (" +
                format_bytes(streaming["streamed_bytes"].get<uint64_t>()) + " in host memory) through " +
                format_number(streaming["ring_slots"]) + " ring slots; " +
                format_bytes(streaming["resident_weight_bytes"].get<uint64_t>()) + " of weights resident\n";
      text += bytes_row("total", model["plan"]["total"].get<uint64_t>()) + ": " +
              (model["fits"].get<bool>() ? "fits" : "does NOT fit") + "\n";
    }
    if (device["models"].size() > 1)
      text += "  all " + format_number(device["models"].size()) + " models together " +
              format_bytes(device["together"]["total"].get<uint64_t>()) + ": " +
              (device["models_together"].get<bool>() ? "fit" : "do NOT fit") + "\n";
  }
  return text;
}

}  // namespace

// --dry-run: each device's plans, at --batch and at the batch the device runs (capped by its
// largest buffer), and whether the models fit together: a table on a terminal, else one JSON
// line; then exit 3 where a model does not fit a device even alone.
void print_extraction_plans(const ExtractOptions &options, const std::vector<ExtractModel> &models,
                            const std::vector<int> &devices) {
  nlohmann::json reports = nlohmann::json::array();
  std::vector<std::unique_ptr<vk::Context>> contexts;
  std::vector<std::vector<MemoryPlan>> plans;
  for (int device : devices) {
    auto &context = *contexts.emplace_back(std::make_unique<vk::Context>(extraction_context(options, device)));
    reports.push_back(device_extraction_plans(context, options, models, plans.emplace_back()));
  }
  nlohmann::json names = nlohmann::json::array();
  for (const ExtractModel &model : models) names.push_back(model.name);
  nlohmann::json summary = {{"dry_run", true},
                            {"model", models.front().resolved.source},
                            {"encoder", options.encoders.empty() ? "" : options.encoders.front()},
                            {"models", names},
                            {"requested_batch", options.batch},
                            {"precision", options.fp16 ? "fp16" : "fp32"},
                            {"weights", options.fp16_weights ? "fp16" : "fp32"},
                            {"stream_weights", options.stream_weights == WeightStreaming::on    ? "on"
                                               : options.stream_weights == WeightStreaming::off ? "off"
                                                                                                : "auto"},
                            {"devices", reports}};
  print_result(summary, extraction_plan_text(summary));
  for (size_t k = 0; k < contexts.size(); ++k)
    for (const MemoryPlan &plan : plans[k]) check_plan_fits(*contexts[k], plan, "lower --batch, or raise --device-memory-limit");
}

}  // namespace tessera
