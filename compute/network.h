// A model: a graph of named layers (JSON), built for one input shape, with its device tensors.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/op.h"
#include "compute/vk/context.h"

namespace tessera {

// The model description for `--model`: a preset name (small-cnn, resnet18, resnet50) or a JSON file,
// completed with the class count and width where the description leaves them open.
nlohmann::json load_model_description(const std::string& model, int classes, int width = 32);
// Expands {"preset": NAME, "classes": K, "width": W} to a graph; returns graphs unchanged.
nlohmann::json expand_presets(const nlohmann::json& description);

// Per-category device bytes, computed from shapes alone (before anything is allocated).
struct MemoryPlan {
  std::map<std::string, uint64_t> bytes;  // "parameters", "gradients", "activations", ...
  uint64_t total() const;
};

// One tensor of the graph as planned, before allocation.
struct PlannedTensor {
  std::string name;
  Shape shape;
  DType dtype;
  std::string category;  // the MemoryPlan key
};

class Network {
 public:
  struct Layer {
    std::string name;
    std::unique_ptr<Op> op;
    std::vector<int> inputs;   // indices of the producing layers; -1 is the network input
    Shape output_shape;
    std::vector<TensorSpec> specs;
    std::vector<std::unique_ptr<Tensor>> tensors, grads;  // grads: parameters only
    std::unique_ptr<Tensor> output, output_grad;
  };

  // Builds the graph for a float32 input of `input_shape` ([N,3,H,W]); throws ModelError
  // naming the layer and field, or naming both layers when shapes do not fit.
  Network(const nlohmann::json& description, const Shape& input_shape, bool with_gradients);

  // The device tensors that allocate() will create, for the memory plan.
  std::vector<PlannedTensor> planned_tensors() const;
  void allocate(vk::Context& context);
  // Parameters and state get PyTorch's default initialisation from the seed.
  void initialise(uint32_t seed);

  // Records the forward pass of all layers, reading `input`. Training uses batch statistics.
  void record_forward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& input, bool training,
                      uint32_t seed, const Tensor& step, uint32_t sample_offset);
  // Records the backward pass; the output gradient must already be in output_grad().
  void record_backward(vk::Recorder& recorder, vk::Kernels& kernels, const Tensor& input, uint32_t seed,
                       const Tensor& step, uint32_t sample_offset);

  const nlohmann::json& description() const { return description_; }
  const Shape& output_shape() const { return layers_.back().output_shape; }
  const Tensor& output() const { return *layers_.back().output; }
  const Tensor& output_grad() const { return *layers_.back().output_grad; }
  std::vector<Layer>& layers() { return layers_; }
  // The layer called `name`; throws naming the known layers.
  Layer& layer(const std::string& name);

  // Every parameter and state tensor by its PyTorch name ("layer1.0.conv1.weight").
  struct Named {
    std::string name;
    Tensor* tensor;
    Tensor* grad;  // nullptr for state
    TensorSpec spec;
  };
  std::vector<Named> named_tensors();

 private:
  OpTensors bindings(size_t layer, const Tensor& input, bool training, uint32_t seed, const Tensor& step,
                     uint32_t sample_offset, bool backward);

  // Fusion, decided once per mode (inference, training) from the graph alone, so that
  // checkpoints and layer names stay PyTorch's: a ReLU whose input has no other consumer runs
  // in the epilogue of the conv2d, linear, batch_norm2d or add before it; in inference a batch norm
  // whose input is a conv2d with no other consumer is folded into that convolution.
  struct Fused {
    bool skipped = false;         // runs inside an earlier layer: records nothing
    int writes_output_of = -1;    // writes the output (and reads the gradient) of this later layer
    bool relu = false;
    int folded_batch_norm = -1;   // conv2d: the batch norm layer folded in
  };
  void plan_fusion();

  nlohmann::json description_;
  Shape input_shape_;
  bool with_gradients_;
  std::vector<Layer> layers_;
  // (layer, input) -> whether its backward adds to the input's gradient rather than writing it.
  std::map<std::pair<size_t, size_t>, bool> accumulate_input_grad_;
  std::array<std::vector<Fused>, 2> fusion_;  // [training]
  std::vector<FoldedBatchNorm> folded_;       // per layer, bound while folded
};

}  // namespace tessera
