#include "compute/ops/vit_tokens.h"

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct TokensPush {
  uint32_t count, width, patches, has_class, prefix;
};
struct ResamplePush {
  uint32_t count, width, prefix;
  uint32_t old_height, old_width, new_height, new_width;
  uint32_t mode;  // VitTokens::Resample
};
struct PoolPush {
  uint32_t count, width, tokens, prefix;
};
struct PoolBackwardPush {
  uint32_t count, width, tokens, accumulate;
};
constexpr const char* kResampled = "resampled_pos_embed";
}  // namespace

std::unique_ptr<Op> make_vit_tokens(const LayerConfig& layer) {
  std::string position =
      layer.choice("position_embedding", "tokens", {"tokens", "patches", "class_and_patches", "none"});
  auto rule = position == "tokens"              ? VitTokens::Position::tokens
              : position == "patches"           ? VitTokens::Position::patches
              : position == "class_and_patches" ? VitTokens::Position::class_and_patches
                                                : VitTokens::Position::none;
  std::array<int64_t, 2> grid{layer.integer("grid_height", 0), layer.integer("grid_width", 0)};
  if ((grid[0] == 0) != (grid[1] == 0)) layer.fail("grid_width", "must be given with grid_height (or neither)");
  const std::string rule_name =
      layer.choice("position_resample", "timm", {"timm", "bicubic", "bicubic_by_scale_factor"});
  auto resample = rule_name == "timm"      ? VitTokens::Resample::timm_antialiased
                  : rule_name == "bicubic" ? VitTokens::Resample::bicubic
                                           : VitTokens::Resample::bicubic_by_scale_factor;
  return std::make_unique<VitTokens>(layer.boolean("class_token", true), layer.integer("register_tokens", 0), rule,
                                     grid, resample);
}

VitTokens::VitTokens(bool class_token, int64_t registers, Position position, std::array<int64_t, 2> grid,
                     Resample resample)
    : class_token_(class_token), registers_(registers), position_(position), grid_(grid), resample_(resample) {}

Shape VitTokens::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 4)
    throw ShapeError("vit_tokens takes the patch embedding [batch, width, grid rows, grid columns]");
  batch_ = inputs[0][0];
  width_ = inputs[0][1];
  input_grid_ = {inputs[0][2], inputs[0][3]};
  if (grid_[0] == 0) grid_ = input_grid_;
  return {batch_, prefix() + input_grid_[0] * input_grid_[1], width_};
}

int64_t VitTokens::covered_prefix() const {
  switch (position_) {
    case Position::tokens: return prefix();
    case Position::class_and_patches: return class_token_ ? 1 : 0;
    case Position::patches:
    case Position::none: return 0;
  }
  return 0;
}

std::vector<TensorSpec> VitTokens::tensors() const {
  std::vector<TensorSpec> specs;
  auto model_level = [&](const char* name, Shape shape, Init init) {
    TensorSpec spec{name, std::move(shape), TensorRole::parameter, DType::f32, init};
    spec.model_level = true;
    specs.push_back(spec);
  };
  if (class_token_) model_level("cls_token", {1, 1, width_}, {Init::normal, 1e-6f});
  if (registers_ > 0) model_level("reg_token", {1, registers_, width_}, {Init::normal, 1e-6f});
  if (position_ == Position::none) return specs;
  const int64_t covered = covered_prefix();
  model_level("pos_embed", {1, covered + grid_[0] * grid_[1], width_}, {Init::normal, 0.02f});
  // Both kernels that read it (vit_tokens_forward, position_embedding_resample) take texels.
  specs.back().follows_weight_dtype = true;
  if (resamples())
    specs.push_back({kResampled, {covered + input_grid_[0] * input_grid_[1], width_}, TensorRole::saved});
  return specs;
}

void VitTokens::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  // Tensors in tensors()'s order; absent ones are unread by the kernel: the input stands in.
  size_t next = 0;
  const Tensor* class_token = class_token_ ? t.tensors[next++] : t.inputs[0];
  const Tensor* registers = registers_ > 0 ? t.tensors[next++] : t.inputs[0];
  const Tensor* position = position_ != Position::none ? t.tensors[next++] : t.inputs[0];
  if (resamples()) {
    const Tensor& resampled = *t.tensors[next];
    const auto covered = static_cast<uint32_t>(covered_prefix());
    recorder.dispatch_elements(
        kernels.get<ResamplePush>(vk::kernel::position_embedding_resample, {kElementwiseGroup}), {reads(*position), writes(resampled)},
        ResamplePush{static_cast<uint32_t>(resampled.count()), static_cast<uint32_t>(width_), covered,
                     static_cast<uint32_t>(grid_[0]), static_cast<uint32_t>(grid_[1]),
                     static_cast<uint32_t>(input_grid_[0]), static_cast<uint32_t>(input_grid_[1]),
                     static_cast<uint32_t>(resample_)},
        static_cast<uint64_t>(resampled.count()), kElementwiseGroup);
    position = &resampled;
  }
  int64_t count = element_count({batch_, prefix() + input_grid_[0] * input_grid_[1], width_});
  auto kernel =
      kernel_for<TokensPush>(kernels, vk::kernel::vit_tokens_forward, *t.output, {kElementwiseGroup, static_cast<int32_t>(position_)});
  recorder.dispatch_elements(
      kernel, {reads(*t.inputs[0]), reads(*class_token), reads(*registers), reads(*position), writes(*t.output)},
      TokensPush{static_cast<uint32_t>(count), static_cast<uint32_t>(width_),
                 static_cast<uint32_t>(input_grid_[0] * input_grid_[1]), class_token_ ? 1u : 0u,
                 static_cast<uint32_t>(prefix())},
      static_cast<uint64_t>(count), kElementwiseGroup);
}

std::unique_ptr<Op> make_token_pool(const LayerConfig& layer) {
  std::string mode = layer.choice("output", "class_token", {"class_token", "class_token_and_patch_mean", "patch_mean"});
  auto rule = mode == "class_token"  ? TokenPool::Mode::class_token
              : mode == "patch_mean" ? TokenPool::Mode::patch_mean
                                     : TokenPool::Mode::class_token_and_patch_mean;
  return std::make_unique<TokenPool>(rule, layer.integer("prefix_tokens", 1));
}

Shape TokenPool::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 3) throw ShapeError("token_pool takes tokens [batch, tokens, width]");
  batch_ = inputs[0][0];
  tokens_ = inputs[0][1];
  width_ = inputs[0][2];
  if (mode_ != Mode::patch_mean && prefix_ < 1)
    throw ShapeError("token_pool: the class token is the first of the prefix tokens, and prefix_tokens is 0");
  if (mode_ != Mode::class_token && tokens_ <= prefix_)
    throw ShapeError("token_pool: no patch tokens after the " + std::to_string(prefix_) + " prefix tokens");
  return {batch_, mode_ == Mode::class_token_and_patch_mean ? 2 * width_ : width_};
}

void TokenPool::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  int64_t count = t.output->count();
  auto kernel = kernel_for<PoolPush>(kernels, vk::kernel::token_pool_forward, *t.output, {kElementwiseGroup, static_cast<int32_t>(mode_)});
  recorder.dispatch_elements(kernel, {reads(*t.inputs[0]), writes(*t.output)},
                             PoolPush{static_cast<uint32_t>(count), static_cast<uint32_t>(width_),
                                      static_cast<uint32_t>(tokens_), static_cast<uint32_t>(prefix_)},
                             static_cast<uint64_t>(count), kElementwiseGroup);
}

void TokenPool::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (mode_ != Mode::class_token) throw std::logic_error("token_pool has no backward pass but for the class token");
  if (!t.input_grads[0]) return;
  const int64_t count = element_count({batch_, tokens_, width_});
  recorder.dispatch_elements(
      kernel_for<PoolBackwardPush>(kernels, vk::kernel::token_pool_backward, *t.output_grad, {kElementwiseGroup}),
      {reads(*t.output_grad), input_grad_arg(t, 0)},
      PoolBackwardPush{static_cast<uint32_t>(count), static_cast<uint32_t>(width_), static_cast<uint32_t>(tokens_),
                       accumulates(t, 0)},
      static_cast<uint64_t>(count), kElementwiseGroup);
}

}  // namespace tessera
