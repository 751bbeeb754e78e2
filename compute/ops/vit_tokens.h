// A ViT's token sequence: the patch embedding (a convolution whose stride is its kernel) laid
// out as tokens, after the class token and the register tokens, plus the learned position
// embedding, as timm's VisionTransformer._pos_embed. The embedding covers every token (timm's
// default), the patches only (no_embed_class: UNI2-h, H-optimus-0), the class token and the
// patches but not the registers (Hugging Face's Dinov2WithRegisters: Hibou) or none; where the
// input's patch grid differs from the grid it was learned on, it is resampled as timm's
// resample_abs_pos_embed (bicubic, antialiased) or as Hugging Face's Dinov2 interpolates it
// (PyTorch's plain bicubic to the new size: a = -0.75, four taps, edges clamped) or as DINO's
// interpolate_pos_encoding does (CONCH v1.5's trunk: the same bicubic by the scale factor
// (new + 0.1) / old), the prefix tokens' rows kept. Its parameters are
// the model's own (timm's names cls_token, reg_token, pos_embed, no layer prefix). Inference only.
#pragma once
#include <array>

#include "compute/ops/registry.h"

namespace tessera {

class VitTokens : public InferenceOp {
 public:
  enum class Position { none, tokens, patches, class_and_patches };  // the shader's POSITION, in order
  enum class Resample { timm_antialiased, bicubic, bicubic_by_scale_factor };  // the shader's mode, in order
  // `grid`: the patch grid (rows, columns) the position embedding was learned on; {0, 0}: the input's.
  VitTokens(bool class_token, int64_t registers, Position position, std::array<int64_t, 2> grid,
            Resample resample = Resample::timm_antialiased);
  std::string type() const override { return "vit_tokens"; }
  // the patch embedding x [N, D, gh, gw] -> [N, prefix + gh * gw, D]
  Shape infer(const std::vector<Shape>& inputs) override;
  // cls_token [1, 1, D], reg_token [1, R, D] (normal, std 1e-6), pos_embed [1, L, D] (normal,
  // std 0.02), as timm's; saved: the resampled embedding where the grids differ
  std::vector<TensorSpec> tensors() const override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

  int64_t prefix() const { return (class_token_ ? 1 : 0) + registers_; }

 private:
  bool resamples() const { return position_ != Position::none && grid_ != input_grid_; }
  // The rows of the position table before its patch grid's: the prefix tokens it covers.
  int64_t covered_prefix() const;

  bool class_token_;
  int64_t registers_;
  Position position_;
  std::array<int64_t, 2> grid_, input_grid_{};
  Resample resample_;
  int64_t batch_ = 0, width_ = 0;
};

std::unique_ptr<Op> make_vit_tokens(const LayerConfig& layer);

// A ViT's output from its tokens [N, T, D]: the class token [N, D]; the class token joined with
// the mean of the patch tokens [N, 2D] (Virchow2); or the mean of the patch tokens [N, D]. Patch
// tokens follow the `prefix` class and register tokens. The class token alone also trains
// (TransMIL's head reads its sequence's class token); the other modes are inference only.
class TokenPool : public Op {
 public:
  enum class Mode { class_token, class_token_and_patch_mean, patch_mean };
  TokenPool(Mode mode, int64_t prefix) : mode_(mode), prefix_(prefix) {}
  std::string type() const override { return "token_pool"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  bool has_backward() const override { return mode_ == Mode::class_token; }
  // class_token: dx[n, 0] (+)= dy[n], the other tokens' gradient zero
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;

 private:
  Mode mode_;
  int64_t prefix_, batch_ = 0, tokens_ = 0, width_ = 0;
};

std::unique_ptr<Op> make_token_pool(const LayerConfig& layer);

}  // namespace tessera
