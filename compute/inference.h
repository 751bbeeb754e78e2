// The one inference path (forward, extract, a slide-level head's tile scores, any encoder added
// later): a model resolved from a checkpoint, preset or model JSON, built for its graph inputs,
// planned and checked against the device's budget before anything is allocated, its weights
// loaded and prepared once (convolution weights blocked, batch norms folded in), and its forward
// pass recorded once and run for every batch.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/checkpoint.h"
#include "compute/memory_plan.h"
#include "compute/network.h"

namespace tessera {

// A model as a graph, with the weights a checkpoint holds (none: random, from seed 0).
struct ResolvedModel {
  nlohmann::json graph;                  // presets expanded
  std::optional<Checkpoint> checkpoint;  // the weights
  std::string safetensors;               // or a .safetensors file of them (timm's names)
  std::string source;                    // the file or preset, for messages
};

// --model: a checkpoint's description and weights, else a preset or model JSON with `classes`
// (where it leaves them open) and random weights. Throws BadInput naming a missing or corrupt
// file, ModelError naming a malformed description.
// With an `encoder` (a ViT preset or model JSON), --model holds its weights: a .safetensors file
// or a converted checkpoint of that architecture (UsageError otherwise); empty: random weights.
ResolvedModel resolve_model(const std::string& model, int classes, const std::string& encoder = "");

// Whether the weights of a model's transformer blocks stay in host memory and stream through a
// ring of device buffers (compute/weight_stream.h): where the resident plan does not fit the
// budget (automatic), always, or never.
enum class WeightStreaming { automatic, on, off };

struct InferenceOptions {
  // What the graph reads (images, features); the caller writes them before each run().
  std::vector<GraphInput> inputs;
  // Host-visible (staging: written in place, as the loader's batches are) or device memory
  // (written with Tensor::upload).
  vk::MemoryUsage input_memory = vk::MemoryUsage::staging;
  // Layers before the model (the normalisation of uint8 images into the layer "input").
  nlohmann::json prologue = nlohmann::json::array();
  // The layer or module ("layer3") the pass ends at; empty: the whole model.
  std::string layer;
  // Activations (outputs of layers that keep the type) f32, or f16.
  DType activations = DType::f32;
  // The large weights (linear and convolution weights, position embeddings:
  // TensorSpec::follows_weight_dtype) f32, or f16: converted once as they are loaded, half the
  // memory, sums still float. Biases, norms and layer-scale gammas stay f32.
  DType weights = DType::f32;
  // Weight streaming; with `on` or where automatic streams, the group size is the largest whose
  // plan fits the budget with at least four groups (one block where none fits).
  WeightStreaming stream_weights = WeightStreaming::off;
  // What to change when the plan does not fit the budget, for the message.
  std::string advice = "lower --batch, or raise --device-memory-limit";
  // Take the SHA-256 of the weights as loaded, before they are prepared (weights_digest()).
  bool weights_digest = false;
};

// The plan Inference would check against the budget for these options, built from shapes alone:
// nothing is allocated (extract --dry-run).
MemoryPlan plan_inference(vk::Context& context, const ResolvedModel& model, const InferenceOptions& options);

// What check_weights read: the model's parameter and state tensors, their values (0 for random
// weights: nothing to read), and the shape of the pass's output (its last extent: the features).
struct WeightsCheck {
  size_t tensors = 0;
  uint64_t values = 0;
  Shape output;
};

// The weights of `model` checked on the host as Inference would load them: every name, shape
// and dtype against the graph, every value read, finite and (fp16 weights) within fp16's range. Nothing is allocated, on the device
// or on disk (tessera doctor). Throws BadInput naming the file and the tensor, ModelError naming
// a malformed description.
WeightsCheck check_weights(const ResolvedModel& model, const InferenceOptions& options);

// The batch a device whose buffers hold at most `largest_buffer` bytes (its
// maxStorageBufferRange: 128 MiB on lavapipe) can run, at most `batch`, with the inputs' first
// dimension as the batch: the largest at which no buffer of the pass is larger (0: not even one
// image). `buffer` and `bytes` name the largest buffer at `batch`.
struct BatchLimit {
  int64_t batch = 0;
  std::string buffer;
  uint64_t bytes = 0;
};
BatchLimit batch_within(const ResolvedModel& model, const InferenceOptions& options, int64_t batch,
                        uint64_t largest_buffer);

class Inference {
 public:
  // Builds, plans and checks the plan against the device's budget (throws OutOfDeviceMemory
  // before anything is allocated), then allocates, loads and prepares the weights and records
  // the forward pass. Throws ModelError, BadInput (weights that do not fit the graph),
  // UsageError (a layer that does not exist).
  Inference(vk::Context& context, const ResolvedModel& model, const InferenceOptions& options);
  ~Inference();

  // The tensor of graph input `name`, to write before run().
  const Tensor& input(const std::string& name) const;
  // One forward pass over what the inputs hold; blocks until it is done.
  void run();
  const Tensor& output() const { return network_->output(); }
  const Shape& output_shape() const { return network_->output_shape(); }
  // The layer the pass ends at (a module's last sublayer), or the model's last.
  const std::string& layer() const { return layer_; }
  // What was checked against the budget: the graph's buffers, the inputs and the step count.
  const MemoryPlan& plan() const { return plan_; }
  // With InferenceOptions::weights_digest: compute/checkpoint.h's digest of the loaded weights.
  const std::string& weights_digest() const { return weights_digest_; }

 private:
  vk::Context& context_;
  std::unique_ptr<Network> network_;
  std::string layer_, weights_digest_;
  MemoryPlan plan_;
  std::map<std::string, std::unique_ptr<Tensor>> inputs_;
  std::unique_ptr<InferenceProgram> program_;
};

}  // namespace tessera
