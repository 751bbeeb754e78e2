// A model: a graph of named layers (JSON), built for one input shape, with its device tensors.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/memory_plan.h"
#include "compute/op.h"
#include "compute/vk/context.h"
#include "compute/vk/memory.h"

namespace tessera {

class LayerConfig;
struct ModelError;

// The model description for `--model`: a preset name (small-cnn, resnet18, resnet50; a ViT's,
// compute/vit.h, without a head) or a JSON file, completed with the class count and width where
// the description of a CNN preset leaves them open.
nlohmann::json load_model_description(const std::string& model, int classes, int width = 32,
                                      const std::string& flag = "--model");
// A model description file as JSON (common/json_input.h's limits, at most 16 MiB), not yet
// checked; BadInput naming `flag` where there is no such file.
nlohmann::json read_model_description(const std::string& path, const std::string& flag);
// Expands {"preset": NAME, "classes": K, "width": W} and ViT descriptions to a graph; returns
// graphs unchanged.
nlohmann::json expand_presets(const nlohmann::json& description);
// The description expanded (expand_presets) and checked before any graph is built: an object
// whose `layers` is a non-empty array of layers, each an object with a name, a type that is an
// op, only fields that op reads and `inputs` an array of names. Throws ModelError (exit 5)
// naming `source` (the file, or a checkpoint's attribute) and where in it ("/layers/3").
nlohmann::json check_model_description(const nlohmann::json& description, const std::string& source);

// A layer check's ModelError ("model: layer 'fc': ...") as `source`'s: "SOURCE: layer 'fc': ...",
// for errors found where the graph is built for its input (shapes, sizes).
ModelError model_error_of(const std::string& source, const ModelError& error);

// Throws UsageError (exit 2) naming `command` where `FLAG fp16` (--precision, --weights) cannot
// run: the device cannot store 16-bit floats in storage buffers (storageBuffer16BitAccess).
void require_fp16_storage(const vk::DeviceInfo& device, const std::string& command,
                          const std::string& flag = "--precision");

// A tensor the graph reads from outside, bound when a pass is recorded: the images, the
// labels, a bag's features and its instance count.
struct GraphInput {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  bool gradient = false;  // the backward pass computes its gradient (op checks)
};

// The device buffers of a graph and the tensors in them, from one walk over the layers: the
// memory plan sums the buffers and allocate() creates them, so the two cannot drift. In
// inference an activation's buffer is handed on once its last consumer has run, so a few
// buffers hold every activation; in training each tensor has a buffer of its own.
struct GraphLayout {
  struct Buffer {
    std::string name;      // its first tensor's name, or "activations (shared)"
    uint64_t bytes = 0;    // the largest tensor it holds, in whole 32-bit words
    std::string category;  // the MemoryPlan key
    vk::MemoryUsage usage = vk::MemoryUsage::device;  // host: streamed weights (StreamGroups)
  };
  // ring: a streamed tensor's place in the ring slot of its group, which passes read.
  enum class Kind { tensor, grad, output, output_grad, input_grad, ring };
  struct Placed {
    std::string name;
    Shape shape;
    DType dtype;
    Kind kind;
    size_t layer = 0, index = 0;  // index: of the TensorSpec (tensor, grad) or the graph input (input_grad)
    size_t buffer = 0;
  };
  std::vector<Buffer> buffers;
  std::vector<Placed> tensors;
  MemoryPlan plan(const vk::Allocator& allocator) const;
};

// Weight streaming (inference only): the parameters and prepared weights of the layers of a group
// stay in host memory (vk::MemoryUsage::host, loaded and prepared there once) and a pass copies
// them, group by group, into a ring of `slots` device buffers: group g into slot g % slots,
// recorded before group g - 1 runs so that the copy may overlap it (compute/weight_stream.h).
struct StreamGroups {
  std::vector<int> group_of_layer;  // per layer: its group, or -1 (resident); empty: nothing streams
  int groups = 0;
  int blocks_per_group = 0;
  int slots = 2;
  bool active() const { return groups > 0; }
};

class Network {
 public:
  struct Layer {
    std::string name;
    std::shared_ptr<Op> op;
    std::vector<int> inputs;   // indices of the producing layers; graph input i is -1 - i
    Shape output_shape;
    std::vector<TensorSpec> specs;
    bool from_model = true;    // false: added by the job (input normalisation, loss)
    std::vector<std::unique_ptr<Tensor>> tensors, grads;  // grads: parameters only
    std::vector<std::unique_ptr<Tensor>> ring;  // streamed: the copy in its ring slot, read once prepared
    std::unique_ptr<Tensor> output, output_grad;
  };

  // Builds the graph for one float32 input "input" of `input_shape` ([N,3,H,W]); throws
  // ModelError naming the layer and field, or naming both layers when shapes do not fit.
  Network(const nlohmann::json& description, const Shape& input_shape, bool with_gradients);
  // The model between layers a job adds before it (`prologue`, e.g. the normalisation of
  // uint8 images into the layer the model calls "input") and after it (`epilogue`, the loss).
  // Only the model's layers are in named_tensors() and description().
  Network(const nlohmann::json& description, std::vector<GraphInput> inputs, bool with_gradients,
          const nlohmann::json& prologue = nlohmann::json::array(),
          const nlohmann::json& epilogue = nlohmann::json::array());
  // One op that reads every graph input (op checks); `op` must outlive the network.
  Network(std::shared_ptr<Op> op, std::vector<GraphInput> inputs, bool with_gradients);

  // The type of activations and their gradients (outputs of layers whose op keeps the type,
  // Op::output_dtype): f32, or f16 in mixed precision. Set before layout() and allocate().
  void set_activation_dtype(DType dtype) { activations_ = dtype; }
  DType activation_dtype() const { return activations_; }
  // Fusion on (the default) or off: off, every layer records its own pass (the reference that
  // tests compare the fused graph with). Set before layout() and allocate().
  void set_fusion(bool enabled);
  // Whether layer `index` runs inside an earlier layer's pass (inference or training).
  bool fused_away(size_t index, bool training) const { return fusion_[training][index].skipped; }

  // The type of the large weights (TensorSpec::follows_weight_dtype) of an inference network:
  // f32, or f16 (converted once as they are loaded; sums stay float). Set before layout() and
  // allocate(); a training network keeps float weights (std::logic_error).
  void set_weight_dtype(DType dtype);
  // Weight streaming (StreamGroups): set before layout() and allocate(), inference only.
  void set_streaming(StreamGroups streaming);
  const StreamGroups& streaming() const { return streaming_; }

  // The walk that both the plan and allocate() follow.
  GraphLayout layout() const;
  MemoryPlan plan(const vk::Allocator& allocator) const { return layout().plan(allocator); }
  void allocate(vk::Context& context);
  // Parameters and state get PyTorch's default initialisation from the seed.
  void initialise(uint32_t seed);
  // Inference, once the weights are loaded: runs every op's prepare() (conv2d's blocked and
  // batch-norm-scaled weight), which forward passes then read instead of redoing it. Once only:
  // linear layers transpose their weight in place, so the weights are no longer the checkpoint's
  // (read them, as the weights digest does, before).
  void prepare(vk::Context& context);

  // Graph inputs by name, as a pass reads them.
  using Bound = std::map<std::string, const Tensor*>;
  struct Pass {
    bool training = false;       // batch statistics, dropout
    uint32_t seed = 0;
    const Tensor* step = nullptr;
    uint32_t sample_offset = 0;  // the micro-batch's first sample in the batch
    ReplicaSync* sync = nullptr;  // training: batch norm statistics over every replica
  };
  // The one place that binds an op's tensors: layer `index`'s inputs, outputs, own tensors
  // and, for backward, the gradients.
  OpTensors bindings(size_t index, const Bound& inputs, const Pass& pass, bool backward) const;
  // Records the forward pass of all layers.
  void record_forward(vk::Recorder& recorder, vk::Kernels& kernels, const Bound& inputs, const Pass& pass);
  void record_forward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& input, const Pass& pass) {
    record_forward(recorder, kernels, Bound{{"input", &input}}, pass);
  }
  // Records the backward pass; the last layer's output gradient must already be there.
  void record_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Bound& inputs, const Pass& pass);
  // The backward pass of layers [begin, end) only, last first: a later part of the network's
  // backward must already be recorded (or have run), so that their output gradients are there.
  void record_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Bound& inputs, const Pass& pass,
                       size_t begin, size_t end);

  const nlohmann::json& description() const { return description_; }
  const std::vector<GraphInput>& inputs() const { return inputs_; }
  // Whether every layer that reads graph input `name` binds it in windows (Op::reads_in_windows),
  // so that it may be over what one binding reaches (vk::Allocator::allocate's `windowed`).
  bool input_windowed(const std::string& name) const;
  const Shape& output_shape() const { return layers_.back().output_shape; }
  const Tensor& output() const { return *layers_.back().output; }
  const Tensor& output_grad() const { return *layers_.back().output_grad; }
  // The gradient of graph input `name`, allocated where GraphInput::gradient is set.
  const Tensor& input_grad(const std::string& name) const;
  std::vector<Layer>& layers() { return layers_; }
  const std::vector<Layer>& layers() const { return layers_; }
  // The layer called `name`; throws naming the known layers.
  Layer& layer(const std::string& name);

  // Every parameter and state tensor of the model by its PyTorch name ("layer1.0.conv1.weight").
  struct Named {
    std::string name;
    Tensor* tensor;
    Tensor* grad;  // nullptr for state
    TensorSpec spec;
  };
  std::vector<Named> named_tensors();

 private:
  void add_layer(const LayerConfig& config, std::shared_ptr<Op> op, const std::vector<std::string>& input_names,
                 bool from_model);
  void add_layers(const nlohmann::json& layers, bool from_model);
  void finish();

  // Fusion, decided once per mode (inference, training) from the graph and what its ops
  // declare (Op::fusions, Op::as_epilogue), so that checkpoints and layer names stay PyTorch's:
  // a layer whose input has no other consumer runs in the store (the Epilogue) of the op that
  // computes that input, where that op applies its step and the steps' order allows it (op.h's
  // Epilogue); an add does where one input is such and the other is written before that op runs.
  // Training fuses a ReLU alone.
  struct Fused {
    bool skipped = false;         // runs inside an earlier layer: records nothing
    int writes_output_of = -1;    // writes the output (and reads the gradient) of this later layer
    // The epilogue by the layers fused in (-1: none): bindings() makes an Epilogue of it.
    int batch_norm = -1;          // the batch norm folded in (conv2d)
    Epilogue::Activation activation = Epilogue::Activation::none;
    int scale = -1;               // the layer_scale whose gamma scales
    int residual = -1;            // the add whose other input is added
    size_t residual_input = 0;    // which of its inputs that is
    bool residual_first = false;  // added before the activation and the scale
  };
  void plan_fusion();
  // The tensor a layer reads from `producer` (graph input i is -1 - i, bound in `inputs`).
  const Tensor* tensor_of(int producer, const Bound& inputs) const;
  // Whether `step` can join the epilogue that `host` has so far (training: a ReLU alone).
  bool joins(const Fused& host, EpilogueStep step, bool training) const;

  nlohmann::json description_;
  std::vector<GraphInput> inputs_;
  bool with_gradients_;
  DType activations_ = DType::f32;
  std::vector<Layer> layers_;
  std::map<std::string, int> index_of_;  // layer or graph input name -> index (graph inputs negative)
  std::vector<std::unique_ptr<Tensor>> input_grads_;
  std::vector<bool> needs_grad_;  // per layer: whether backward reaches it
  // (layer, input) -> whether its backward adds to the input's gradient rather than writing it.
  std::map<std::pair<size_t, size_t>, bool> accumulate_input_grad_;
  std::array<std::vector<Fused>, 2> fusion_;  // [training]
  bool fusion_enabled_ = true;
  bool prepared_ = false;
  StreamGroups streaming_;
  mutable std::vector<FoldedBatchNorm> folded_;  // per layer, bound while folded
};

// A forward pass in evaluation mode, recorded once and run any number of times (the recorded
// part of compute/inference.h), with the optimizer step count that ops read (a u32 [2] of zeros).
class InferenceProgram {
 public:
  InferenceProgram(vk::Context& context, Network& network, const Network::Bound& inputs);
  void run() { program_.run(); }
  // The bytes of the step count it allocates.
  static constexpr uint64_t step_bytes = 8;

 private:
  Tensor step_;
  vk::Program program_;
};

}  // namespace tessera
