// Nystrom attention (Xiong et al. 2021) as TransMIL's layers use it: lucidrains' NystromAttention
// (nystrom_attention.py) between its to_qkv and to_out projections, which are linear layers of
// the graph. Per head: landmarks are the means of m runs of the sequence (front-padded with
// zero rows to a multiple of m), out = softmax(q kl^T) pinv(softmax(ql kl^T)) softmax(ql k^T) v
// with the pseudo-inverse by 6 Newton-Schulz iterations, plus a depthwise convolution of v along
// the sequence (res_conv). The sequence's length S comes from the bag's count on the device
// (transmil_grid.glsl); rows past it are written 0 and get no gradient. The output is the last
// S rows of the padded sequence, as nystrom-attention 0.0.10 on (d7eb229, "fix padding bug");
// TransMIL's requirements.txt pins 0.0.9, which returned the first S (the padding's rows among them).
// With `class_attention` (inference: a heatmap's scores) the output is instead each patch's
// attention from the class token, row 0 of softmax(q kl^T) pinv softmax(ql k^T), summed over
// the patch's places in the sequence (its wrapped-around copy too) and averaged over the heads.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class NystromAttention : public Op {
 public:
  NystromAttention(int64_t heads, int64_t landmarks, int64_t pinv_iterations, int64_t residual_kernel,
                   bool class_attention = false)
      : heads_(heads), landmarks_(landmarks), iterations_(pinv_iterations), kernel_(residual_kernel),
        class_attention_(class_attention) {}
  std::string type() const override { return "nystrom_attention"; }
  // qkv [1, S_max, 3D] (to_qkv's output), count u32 [1] -> [1, S_max, D]; class_attention:
  // [S_max - 1, 1], a score for each of the bag's first rows
  Shape infer(const std::vector<Shape>& inputs) override;
  // res_conv.weight [heads, 1, kernel, 1]; saved: the landmarks, the three softmaxes, every
  // iterate of the pseudo-inverse, backward's scratch (training graphs alone) and
  // class_attention's (inference graphs alone)
  std::vector<TensorSpec> tensors() const override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  double forward_flops() const override;
  bool has_backward() const override { return !class_attention_; }

 private:
  int64_t heads_, landmarks_, iterations_, kernel_;
  bool class_attention_;
  int64_t rows_ = 0, width_ = 0, head_dim_ = 0;
};

std::unique_ptr<Op> make_nystrom_attention(const LayerConfig& layer);

}  // namespace tessera
