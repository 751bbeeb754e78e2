#include "compute/ops/batch_norm2d.h"

#include <algorithm>

#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
// The workgroup that reduces one channel: a power of two (shaders/reduce.glsl).
constexpr uint32_t kChannelGroup = 256;
// On a GPU, each channel's elements in slices, one workgroup each, so that a layer of few
// channels and many pixels (resnet's first, 64 channels of 112x112) still fills the device:
// this many workgroups at least, slices of this many elements at least.
constexpr int64_t kTargetWorkgroups = 1024, kMinSliceLength = 2048, kMaxSlices = 32;

enum Slot : size_t { weight, bias, running_mean, running_var, mean, invstd, exchanged, slice_sums };

struct MomentsPush {
  uint32_t batch, channels, plane, slice_length;
};
struct ForwardPush {
  uint32_t batch, channels, plane;
  float eps, momentum;
  uint32_t training, total, slice_length;
};
struct BackwardPush {
  uint32_t batch, channels, plane, training, accumulate, total, slice_length;
};
struct CombinePush {
  uint32_t count, channels, slice_length, slices;
};
}  // namespace

std::unique_ptr<Op> make_batch_norm2d(const LayerConfig& layer) {
  double eps = layer.number("eps", 1e-5), momentum = layer.number("momentum", 0.1);
  if (!(eps > 0)) layer.fail("eps", "must be above 0");
  if (!(momentum >= 0 && momentum <= 1)) layer.fail("momentum", "must be in [0, 1]");
  return std::make_unique<BatchNorm2d>(static_cast<float>(eps), static_cast<float>(momentum));
}

Shape BatchNorm2d::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || (inputs[0].size() != 4 && inputs[0].size() != 2))
    throw ShapeError("batch_norm2d takes one [N,C,H,W] or [N,C] input, got " +
                     (inputs.empty() ? std::string("none") : to_string(inputs[0])));
  batch_ = inputs[0][0];
  channels_ = inputs[0][1];
  plane_ = inputs[0].size() == 4 ? inputs[0][2] * inputs[0][3] : 1;
  return inputs[0];
}

std::vector<TensorSpec> BatchNorm2d::tensors() const {
  Shape c{channels_};
  TensorSpec slices{"slice_sums", {kMaxSlices, 2, channels_}, TensorRole::saved};
  slices.training_only = slices.pass_scratch = true;  // each pass's partial sums, read in that pass
  return {{"weight", c, TensorRole::parameter, DType::f32, {Init::ones}},
          {"bias", c, TensorRole::parameter, DType::f32, {Init::zeros}},
          {"running_mean", c, TensorRole::state, DType::f32, {Init::zeros}},
          {"running_var", c, TensorRole::state, DType::f32, {Init::ones}},
          {"mean", c, TensorRole::saved},
          {"invstd", c, TensorRole::saved},
          {ReplicaSync::kExchanged, {2, channels_}, TensorRole::saved},
          slices};
}

ReductionSlices BatchNorm2d::slicing(const vk::TileTarget& target) const {
  int64_t count = batch_ * plane_;
  if (target.cpu_like()) return reduction_slices(count, 1);
  return reduction_slices(
      count, std::clamp<int64_t>(std::min((kTargetWorkgroups + channels_ - 1) / channels_, count / kMinSliceLength), 1,
                                 kMaxSlices));
}

void BatchNorm2d::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto running = [&](size_t slot) {
    const Tensor& b = *t.tensors[slot];
    return t.training ? updates(b) : reads(b);
  };
  auto groups = static_cast<uint32_t>(channels_);
  int64_t elements = batch_ * plane_;
  ForwardPush push{static_cast<uint32_t>(batch_), static_cast<uint32_t>(channels_), static_cast<uint32_t>(plane_),
                   eps_, momentum_, t.training ? 1u : 0u, static_cast<uint32_t>(elements),
                   static_cast<uint32_t>(elements)};
  std::vector<int32_t> constants{static_cast<int32_t>(kChannelGroup), t.epilogue.relu() ? 1 : 0};
  const Tensor& statistics = *t.tensors[exchanged];
  auto normalize_with_statistics = [&](uint32_t slices) {
    recorder.dispatch(kernel_for<ForwardPush>(kernels, vk::kernel::batch_norm2d_forward_synced, *t.output, constants),
                      {reads(*t.inputs[0]), reads(*t.tensors[weight]), reads(*t.tensors[bias]), running(running_mean),
                       running(running_var), writes(*t.tensors[mean]), writes(*t.tensors[invstd]), writes(*t.output),
                       reads(statistics)},
                      push, groups, slices);
  };
  // Made where a path dispatches it: making a pipeline compiles it.
  auto moments = [&] {
    return kernel_for<MomentsPush>(kernels, vk::kernel::batch_norm2d_moments, *t.inputs[0], {kChannelGroup});
  };
  if (t.sync) {
    recorder.dispatch(moments(), {reads(*t.inputs[0]), writes(statistics)},
                      MomentsPush{push.batch, push.channels, push.plane, push.slice_length}, groups);
    t.sync->exchange(recorder, statistics, ReplicaSync::Combine::moments, elements);
    push.total = static_cast<uint32_t>(t.sync->batch_total() * plane_);
    normalize_with_statistics(1);
    return;
  }
  if (ReductionSlices slices = slicing(kernels.tile_target()); t.training && slices.count > 1) {
    // Each slice's moments, merged per channel, then each slice normalised.
    const Tensor& partial = *t.tensors[slice_sums];
    push.slice_length = static_cast<uint32_t>(slices.length);
    recorder.dispatch(moments(), {reads(*t.inputs[0]), writes(partial)},
                      MomentsPush{push.batch, push.channels, push.plane, push.slice_length}, groups,
                      static_cast<uint32_t>(slices.count));
    recorder.dispatch_elements(kernels.get<CombinePush>(vk::kernel::batch_norm2d_combine_moments, {kChannelGroup}),
                               {reads(partial), writes(statistics)},
                               CombinePush{push.total, push.channels, push.slice_length,
                                           static_cast<uint32_t>(slices.count)},
                               channels_, kChannelGroup);
    normalize_with_statistics(static_cast<uint32_t>(slices.count));
    return;
  }
  const auto& forward =
      reduction_kernel(kernels, vk::kernel::batch_norm2d_forward, vk::kernel::batch_norm2d_forward_subgroup);
  recorder.dispatch(kernel_for<ForwardPush>(kernels, forward, *t.output, constants),
                    {reads(*t.inputs[0]), reads(*t.tensors[weight]), reads(*t.tensors[bias]), running(running_mean),
                     running(running_var), writes(*t.tensors[mean]), writes(*t.tensors[invstd]), writes(*t.output)},
                    push, groups);
}

void BatchNorm2d::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  bool input_grad = t.input_grads[0] != nullptr;
  int64_t elements = batch_ * plane_;
  BackwardPush push{static_cast<uint32_t>(batch_), static_cast<uint32_t>(channels_), static_cast<uint32_t>(plane_),
                    t.training ? 1u : 0u, input_grad ? accumulates(t, 0) : 0u, static_cast<uint32_t>(elements),
                    static_cast<uint32_t>(elements)};
  auto x = reads(*t.inputs[0]), w = reads(*t.tensors[weight]),
       m = reads(*t.tensors[mean]), s = reads(*t.tensors[invstd]),
       dy = reads(*t.output_grad), dw = updates(*t.grads[weight]),
       db = updates(*t.grads[bias]), y = reads(*t.output);
  auto groups = static_cast<uint32_t>(channels_);
  std::vector<int32_t> constants{static_cast<int32_t>(kChannelGroup), t.epilogue.relu() ? 1 : 0};
  // This device's variant of a kernel that sums over the channel (op.h's reduction_kernel).
  auto summing = [&](const vk::ActivationKernel& shared, const vk::ActivationKernel& subgroup) {
    return kernel_for<BackwardPush>(kernels, reduction_kernel(kernels, shared, subgroup), *t.output_grad, constants);
  };
  auto sums_kernel = [&] {
    return summing(vk::kernel::batch_norm2d_backward_sums, vk::kernel::batch_norm2d_backward_sums_subgroup);
  };
  const Tensor& sums = *t.tensors[exchanged];
  auto input_grad_from_sums = [&](uint32_t slices) {
    recorder.dispatch(kernel_for<BackwardPush>(kernels, vk::kernel::batch_norm2d_backward_synced, *t.output_grad, constants),
                      {x, w, m, s, dy, y, reads(sums), input_grad_arg(t, 0)}, push, groups, slices);
  };
  if (input_grad && t.sync) {
    recorder.dispatch(sums_kernel(), {x, w, m, s, dy, dw, db, y, writes(sums)}, push, groups);
    t.sync->exchange(recorder, sums, ReplicaSync::Combine::sum, elements);
    push.total = static_cast<uint32_t>(t.sync->batch_total() * plane_);
    input_grad_from_sums(1);
  } else if (ReductionSlices slices = slicing(kernels.tile_target()); t.training && slices.count > 1) {
    // Each slice's sums, added per channel (with the parameter gradients), then each slice's dx.
    const Tensor& partial = *t.tensors[slice_sums];
    push.slice_length = static_cast<uint32_t>(slices.length);
    auto count = static_cast<uint32_t>(slices.count);
    recorder.dispatch(sums_kernel(), {x, w, m, s, dy, dw, db, y, writes(partial)}, push, groups, count);
    recorder.dispatch_elements(kernels.get<CombinePush>(vk::kernel::batch_norm2d_combine_sums, {kChannelGroup}),
                               {reads(partial), writes(sums), dw, db},
                               CombinePush{push.total, push.channels, push.slice_length, count}, channels_,
                               kChannelGroup);
    if (input_grad) input_grad_from_sums(count);
  } else if (input_grad) {
    recorder.dispatch(summing(vk::kernel::batch_norm2d_backward, vk::kernel::batch_norm2d_backward_subgroup),
                      {x, w, m, s, dy, dw, db, y, input_grad_arg(t, 0)}, push, groups);
  } else {
    recorder.dispatch(summing(vk::kernel::batch_norm2d_backward_parameters,
                              vk::kernel::batch_norm2d_backward_parameters_subgroup),
                      {x, w, m, s, dy, dw, db, y}, push, groups);
  }
}

}  // namespace tessera
