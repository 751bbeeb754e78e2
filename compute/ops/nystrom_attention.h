// Nystrom attention (Xiong et al. 2021) as TransMIL's layers use it: lucidrains' NystromAttention
// (nystrom_attention.py) from its to_qkv projection (without bias; its weight keeps that name) up
// to its to_out projection, a linear layer of the graph. q, k and v are three buffers of [S, D],
// not one of [S, 3D] (lavapipe binds 128 MiB: 3D alone would stop at 43,000 patches in fp16),
// and each pass computes them afresh, so that no layer holds them between its forward and its
// backward. Per head: landmarks are the means of m runs of the sequence (front-padded with
// zero rows to a multiple of m), out = softmax(q kl^T) pinv(softmax(ql kl^T)) softmax(ql k^T) v
// with the pseudo-inverse by 6 Newton-Schulz iterations, plus a depthwise convolution of v along
// the sequence (res_conv). The sequence's length S comes from the bag's count on the device
// (transmil_grid.glsl); rows past it are written 0 and get no gradient. The output is the last
// S rows of the padded sequence, as nystrom-attention 0.0.10 on (d7eb229, "fix padding bug");
// TransMIL's requirements.txt pins 0.0.9, which returned the first S (the padding's rows among them).
// With `class_token` the output is the class token's row alone, [1, D], for a model that reads
// nothing else of it (TransMIL's second layer): the first softmax is then taken for that row
// only. With `class_attention` (inference: a heatmap's scores) the output is instead each patch's
// attention from the class token, row 0 of softmax(q kl^T) pinv softmax(ql k^T), summed over
// the patch's places in the sequence (its wrapped-around copy too) and averaged over the heads.
// The two softmaxes that span the sequence, [heads, S, m] and [heads, m, S] (3.3 GB in fp32 for
// a bag of 100,000 at TransMIL's width), are never stored whole: both passes take the sequence a
// chunk of rows at a time and recompute them there, as flash attention does, the third's row
// maxima and sums kept from a first pass over the chunks (its backward's row sums from dw and w).
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class NystromAttention : public Op {
 public:
  enum class Output { values, class_token, class_attention };
  // chunk_rows: the sequence's rows a chunk (0: as many as keep a chunk's scores [heads, rows, m]
  // within 32 MiB). recompute: backward computes q, k, v and the pseudo-inverse's iterates again
  // (pass scratch that the layers share) rather than keep them from forward (three [S, D] and
  // 5 x iterations [h, m, m] a layer); the gradients are the same to the bit.
  NystromAttention(int64_t heads, int64_t landmarks, int64_t pinv_iterations, int64_t residual_kernel,
                   Output output = Output::values, int64_t chunk_rows = 0, bool recompute = true)
      : heads_(heads), landmarks_(landmarks), iterations_(pinv_iterations), kernel_(residual_kernel),
        output_(output), chunk_rows_(chunk_rows), recompute_(recompute) {}
  std::string type() const override { return "nystrom_attention"; }
  // x [1, S_max, D] (the layer norm's output), count u32 [1] -> [1, S_max, D]; class_token: [1, D];
  // class_attention: [S_max - 1, 1], a score for each of the bag's first rows
  Shape infer(const std::vector<Shape>& inputs) override;
  // to_qkv.weight [3D, D] (read as three windows), res_conv.weight [heads, 1, kernel, 1];
  // scratch of each pass: q, k, v (saved from forward without `recompute`), a chunk's scores (and
  // backward's gradients of them, dk and dv in the buffers of q and v);
  // saved: the landmarks, softmax(ql kl^T), softmax(ql k^T)'s row statistics, every iterate of
  // the pseudo-inverse, and class_attention's scratch (inference graphs alone)
  std::vector<TensorSpec> tensors() const override;
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  double forward_flops() const override;
  bool has_backward() const override { return output_ != Output::class_attention; }

 private:
  int64_t heads_, landmarks_, iterations_, kernel_;
  Output output_;
  int64_t chunk_rows_;
  bool recompute_;
  int64_t rows_ = 0, width_ = 0, head_dim_ = 0, chunk_ = 0;
};

std::unique_ptr<Op> make_nystrom_attention(const LayerConfig& layer);

}  // namespace tessera
