// Batch normalisation, PyTorch's nn.BatchNorm2d (affine, tracked running statistics) on
// [N,C,H,W], and BatchNorm1d's semantics on [N,C]. Training normalises with the batch's
// statistics and updates the running ones; evaluation uses the running ones.
#pragma once
#include "compute/ops/registry.h"

namespace tessera {

class BatchNorm2d : public Op {
 public:
  BatchNorm2d(float eps, float momentum) : eps_(eps), momentum_(momentum) {}
  std::string type() const override { return "batch_norm2d"; }
  Shape infer(const std::vector<Shape>& inputs) override;
  // weight [C] (ones), bias [C] (zeros); running_mean [C] (zeros), running_var [C] (ones);
  // saved: mean [C] and invstd [C], the statistics that forward normalised with; exchanged
  // [2,C], what replicas combine with --sync-bn (see ReplicaSync); training alone, slice_sums
  // [32,2,C], each slice's moments or sums on a GPU
  std::vector<TensorSpec> tensors() const override;
  // x [N,C,(H,W)] -> y, one workgroup per channel, or on a GPU per slice of a channel in
  // training (then max(y, 0) with a fused ReLU); with a
  // ReplicaSync, the statistics of every replica's batch together (PyTorch's SyncBatchNorm)
  void forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  // dy -> dx, dweight, dbias, one workgroup per channel (or slice of one, as forward)
  void backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) override;
  EpilogueSteps fusions() const override { return {EpilogueStep::relu}; }
  // In inference, folded into the convolution before it (Conv2d::fusions).
  AsEpilogue as_epilogue() const override { return {EpilogueStep::batch_norm, eps_}; }

 private:
  // Each channel's elements (N*H*W) in slices, in training on this device.
  ReductionSlices slicing(const vk::TileTarget& target) const;
  float eps_, momentum_;
  int64_t batch_ = 0, channels_ = 0, plane_ = 0;
};

std::unique_ptr<Op> make_batch_norm2d(const LayerConfig& layer);

}  // namespace tessera
