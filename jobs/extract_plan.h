// What an extraction decides on the device side before any work: the pass over a batch of
// tiles, the batch each device can run, and --dry-run's plans.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/inference.h"
#include "compute/vk/context.h"
#include "jobs/batch_choice.h"
#include "jobs/extract.h"
#include "jobs/extract_inputs.h"

namespace tessera {

// The pass over a batch of uint8 tiles [batch, input_size, input_size, channels] (RGB, or a
// multiplex slide's channels), which the prologue turns into the layer the model reads as
// "input": an encoder's normalisation and, where the features are fp16, its activations in fp16;
// a CNN's, up to options.layer. The weights' digest is taken for the feature files.
InferenceOptions extraction_inference(const ExtractOptions &options, const ExtractModel &model);

// --batch, or less where a buffer of the pass would be larger than the device's largest (its
// maxStorageBufferRange: 128 MiB on lavapipe); `capped` then says so (a warning line). Throws
// OutOfDeviceMemory when one tile is too many.
int64_t capped_batch(const ResolvedModel &model, const InferenceOptions &inference, const vk::DeviceInfo &device,
                     int64_t batch, nlohmann::json &capped);

// The batch of `model` on `context` without --batch: the largest up to batch_speed_cap whose plan
// (within the device's largest buffer) takes at most chosen_batch_budget_share of `budget`.
BatchChoice chosen_extraction_batch(const ExtractOptions &options, const ExtractModel &model, vk::Context &context,
                                    uint64_t budget);

// The context of device `device` (an index; -1 the default) with --device-memory-limit.
vk::ContextOptions extraction_context(const ExtractOptions &options, int device);

// The plans of the models on one device, as --dry-run reports them: each model's at --batch and
// at the batch the device runs (capped by its largest buffer), whether it fits the budget alone
// (`fits`) and with the others (`models_together`). `plans` receives each model's plan at the
// batch it runs. Throws OutOfDeviceMemory where one tile is too many for a buffer.
nlohmann::json device_extraction_plans(vk::Context &context, const ExtractOptions &options,
                                      const std::vector<ExtractModel> &models, std::vector<MemoryPlan> &plans);

// --dry-run: each device's plans (each model's at --batch and at the batch the device runs, and
// whether they fit together), as one JSON line on stdout; then OutOfDeviceMemory (exit 3) where a
// model does not fit a device even alone. Nothing is read, written or allocated.
void print_extraction_plans(const ExtractOptions &options, const std::vector<ExtractModel> &models,
                            const std::vector<int> &devices);

}  // namespace tessera
