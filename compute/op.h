// The layer interface every op fits: shape inference, the tensors it owns, and a forward and
// a backward pass that record dispatches into a Recorder.
#pragma once
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/tensor.h"
#include "compute/vk/kernels.h"
#include "compute/vk/recorder.h"

namespace tessera {

enum class TensorRole {
  parameter,  // trained; has a gradient; saved in checkpoints (conv.weight)
  state,      // not trained but saved in checkpoints (bn.running_mean)
  saved,      // written by forward, read by backward, not saved (bn batch mean, pool argmax)
  // Derived from the parameters alone (conv2d's blocked weight): an inference network computes
  // it once, when its weights are loaded (Op::prepare); training recomputes it in every forward.
  prepared,
};

// Parameters and state: what checkpoints hold and initialisation fills.
inline bool in_checkpoint(TensorRole role) { return role == TensorRole::parameter || role == TensorRole::state; }

// How a parameter or state tensor starts. PyTorch's defaults, so that a model trained here
// starts from the same distribution as the same model in PyTorch.
struct Init {
  enum Kind { zeros, ones, uniform, normal, constant } kind = zeros;
  float scale = 0;  // uniform: the bound b of U(-b, b); normal: the standard deviation; constant: the value
};

struct TensorSpec {
  std::string name;  // "weight", "bias", "running_mean"; the graph prefixes "<layer>."
  Shape shape;
  TensorRole role = TensorRole::parameter;
  DType dtype = DType::f32;
  Init init;
  // Named without the layer's prefix: a parameter of the model itself rather than of a module
  // (timm's cls_token, reg_token and pos_embed).
  bool model_level = false;
  // A tensor that only inference reads (linear's scratch for transposing its weight in
  // prepare()): a training graph allocates none and binds nullptr in its place.
  bool inference_only = false;
  // Its opposite: a saved tensor that only a training forward writes and backward reads
  // (layer_norm's per-row statistics): an inference graph allocates none and binds nullptr.
  bool training_only = false;
  // Scratch that one pass of the layer (its forward or its backward) writes and reads before it
  // returns (split-K partial sums, Nystrom attention's projections): in a training graph the
  // layer's i-th such tensor shares buffer i with every other layer's i-th, sized for the largest.
  bool pass_scratch = false;
  // Of the graph's activation type (Network::set_activation_dtype) rather than `dtype`: a saved
  // tensor as large as an activation, which fp16 halves as it halves them.
  bool activation_typed = false;
  // A large weight that every kernel reads through a texel view of its own type (GEMM operands,
  // samplerBuffer reads): an inference network stores it in its weight type instead of `dtype`
  // (Network::set_weight_dtype: fp16 halves a ViT's memory). Small tensors (biases, norms,
  // layer-scale gammas, class and register tokens) stay float.
  bool follows_weight_dtype = false;
};

// A tensor's full name: "<layer>.<spec>", or the spec's name alone where it is model-level.
inline std::string tensor_name(const std::string& layer, const TensorSpec& spec) {
  return spec.model_level ? spec.name : layer + "." + spec.name;
}

// A batch norm folded into the convolution before it (inference): its tensors and epsilon.
struct FoldedBatchNorm {
  const Tensor *weight, *bias, *running_mean, *running_var;
  float eps;
};

// The one vocabulary of fusion: the steps that a layer can be when it runs in the store of the
// GEMM-like op before it (Op::as_epilogue), and those that an op's store applies (Op::fusions).
enum class EpilogueStep : uint8_t {
  none,
  batch_norm,  // inference: folded (the weight scaled in prepare, the shift added)
  relu,
  gelu,        // PyTorch's erf form (nn.GELU()), shaders/activations.glsl
  silu,
  scale,       // timm's LayerScale: y * gamma[feature]
  residual,    // add: y + the add's other input
};

// A set of steps, what an op's store applies.
class EpilogueSteps {
 public:
  EpilogueSteps() = default;
  EpilogueSteps(std::initializer_list<EpilogueStep> steps) {
    for (EpilogueStep step : steps) bits_ |= 1u << static_cast<unsigned>(step);
  }
  bool contains(EpilogueStep step) const { return (bits_ >> static_cast<unsigned>(step)) & 1u; }

 private:
  unsigned bits_ = 0;
};

// What a GEMM-like op's store applies to each output y = sum + bias, in this order: the folded
// batch norm, the residual where residual_first (ResNet: bn, add, relu), the activation, the
// scale, the residual otherwise (a ViT: proj, ls1, add). The graph fills it from the layers that
// follow the op where nothing else reads their inputs (Network's fusion plan), so that names,
// parameters and checkpoints stay PyTorch's. Training fuses a ReLU alone (its backward masks by
// the output); GELU and SiLU need their input in backward, and the other steps run in inference
// only, so they fuse in inference alone.
struct Epilogue {
  enum class Activation : int32_t { none, relu, gelu, silu };  // the shaders' ACTIVATION constant
  const FoldedBatchNorm* batch_norm = nullptr;
  Activation activation = Activation::none;
  const Tensor* scale = nullptr;     // [features]: y * scale[feature]
  const Tensor* residual = nullptr;  // the output's shape and type: y + residual
  bool residual_first = false;
  bool relu() const { return activation == Activation::relu; }
};

// --sync-bn: batch norm over every replica of a data-parallel run. An op records the kernel that
// writes its per-channel partial values into `values`, calls exchange(), and records the rest,
// which reads `values` combined over every replica: the trainer ends the command buffer there
// and combines them on the host before the next one runs. `values` is the op's saved tensor
// named kExchanged, of which the trainer plans a host-visible copy.
class ReplicaSync {
 public:
  static constexpr const char* kExchanged = "exchanged";
  enum class Combine {
    moments,  // [mean; M2] per channel of `count` elements -> [mean; biased variance] of all
    sum,      // each value summed
  };
  virtual ~ReplicaSync() = default;
  // Samples of the micro-batch over every replica.
  virtual int64_t batch_total() const = 0;
  virtual void exchange(vk::Recorder& recorder, const Tensor& values, Combine combine, int64_t count) = 0;
};

// What an op's passes read and write. Gradients of parameters are always accumulated (+=):
// the optimizer zeroes them after each update, which is what makes --accumulate K add up
// K micro-batches. Gradients of inputs are overwritten unless accumulate_input_grads says
// that another consumer of the same tensor has already written there (residual branches).
struct OpTensors {
  std::vector<const Tensor*> inputs;
  std::vector<const Tensor*> input_grads;  // nullptr where no gradient flows (the images)
  std::vector<bool> accumulate_input_grads;
  const Tensor* output = nullptr;
  const Tensor* output_grad = nullptr;     // nullptr in inference
  std::vector<const Tensor*> tensors;      // one per TensorSpec, in order
  std::vector<const Tensor*> grads;        // gradients of the parameters, nullptr for others
  bool training = true;                    // batch norm statistics, dropout
  uint32_t seed = 0;                       // dropout: the run's seed, mixed with the layer's name
  const Tensor* step = nullptr;            // u32 [2]: optimizer step count, bumped on device
  uint32_t sample_offset = 0;              // index of the micro-batch's first sample in the batch
  ReplicaSync* sync = nullptr;             // training with --sync-bn over several replicas
  // What the graph fused into this op's store (Epilogue): `output` is then the output of the
  // last layer fused in. A ReLU (the one step training fuses) masks output_grad by output > 0
  // in backward before the op's own backward reads it.
  Epilogue epilogue;
  // Inference after Op::prepare: the prepared tensors hold what it wrote; forward reads them.
  bool prepared = false;
};

class Op {
 public:
  virtual ~Op() = default;
  virtual std::string type() const = 0;
  // The output shape for these inputs; remembers them for the passes. Throws ShapeError.
  virtual Shape infer(const std::vector<Shape>& inputs) = 0;
  virtual std::vector<TensorSpec> tensors() const { return {}; }
  // The type of the output (and its gradient) where the graph's activations are `activations`:
  // the same, except for outputs that are not activations (a loss, kept in float).
  virtual DType output_dtype(DType activations) const { return activations; }
  virtual void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) = 0;
  virtual void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) = 0;
  // Writes the prepared tensors (TensorRole::prepared) from the parameters, with forward's
  // bindings: an inference network records it once, after its weights are loaded, and its
  // forward passes then skip that work (OpTensors::prepared).
  virtual void prepare(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
    (void)recorder;
    (void)kernels;
    (void)t;
  }
  // The steps this op's store applies (OpTensors::epilogue), and which step it is in the store
  // of the op before it; `eps`: a batch norm's epsilon.
  virtual EpilogueSteps fusions() const { return {}; }
  struct AsEpilogue {
    EpilogueStep step = EpilogueStep::none;
    float eps = 0;
  };
  virtual AsEpilogue as_epilogue() const { return {}; }
  // Whether both passes bind input `input` a window at a time wherever it is over what one
  // binding reaches, so that a graph input read by such ops alone may be (GraphInput::windowed).
  virtual bool reads_in_windows(size_t input) const {
    (void)input;
    return false;
  }
  // False for ops that run in inference only (a ViT's): a graph that would train them is refused.
  virtual bool has_backward() const { return true; }
  // Floating-point operations of one forward pass, for benchmarks.
  virtual double forward_flops() const { return 0; }
};

// An op that runs forward only (inference: feature extraction with foundation models).
class InferenceOp : public Op {
 public:
  bool has_backward() const override { return false; }
  void backward(vk::Recorder&, vk::Kernels&, const OpTensors&) override {
    throw std::logic_error(type() + " has no backward pass");
  }
};

// Shapes that do not fit an op (the graph adds the layer names).
struct ShapeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The pipeline of `kernel` in its variant for activations of `activation`'s type (fp16 or float;
// cmake/shaders.cmake compiles both from one source, and the recorder checks that every storage
// binding gets a buffer of its type), for push constants of type Push.
template <class Push = vk::NoPush>
vk::Pipeline<Push> kernel_for(vk::Kernels& kernels, const vk::ActivationKernel& kernel, const Tensor& activation,
                              const std::vector<int32_t>& constants = {}) {
  return kernels.get<Push>(activation.dtype() == DType::f16 ? kernel.f16 : kernel.f32, constants);
}
// The same, in its variant for an operand B of `operand`'s type.
template <class Push = vk::NoPush>
vk::Pipeline<Push> kernel_for(vk::Kernels& kernels, const vk::OperandKernel& kernel, const Tensor& activation,
                              const Tensor& operand, const std::vector<int32_t>& constants = {}) {
  return kernel_for<Push>(kernels, operand.dtype() == DType::f16 ? kernel.b16 : kernel.b32, activation, constants);
}

// Whether the sums over a channel or a batch (batch-norm statistics, bias gradients, the loss)
// add within each subgroup first (subgroupAdd, shaders/reduce.glsl): on GPUs with subgroup
// arithmetic. CPU-like devices (lavapipe) keep the tree through shared memory, faster there
// (a batch norm's training step and a bias gradient: 1.75x on [16,256,14,14], 1.65x on
// [64,512,7,7], 1.05x on [16,64,56,56]; bench_gemm's batch_norm_and_bias_backward).
inline bool subgroup_reductions(const vk::TileTarget& target) {
  return target.subgroup_arithmetic && !target.cpu_like();
}

// A reduction kernel's variant for the device: `subgroup` where subgroup_reductions, else `shared`.
template <class Kernel>
const Kernel& reduction_kernel(const vk::Kernels& kernels, const Kernel& shared, const Kernel& subgroup) {
  return subgroup_reductions(kernels.tile_target()) ? subgroup : shared;
}

// The standard workgroup size of elementwise kernels.
constexpr uint32_t kElementwiseGroup = 256;

// A reduction over `elements` split into about `wanted` slices of equal length (the last one
// shorter), one workgroup each: the slices none of which is empty, and their length.
struct ReductionSlices {
  int64_t count, length;
};
inline ReductionSlices reduction_slices(int64_t elements, int64_t wanted) {
  int64_t length = (elements + wanted - 1) / wanted;
  return {(elements + length - 1) / length, length};
}

}  // namespace tessera
