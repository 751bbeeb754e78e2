#include "compute/ops/attention_pool.h"

#include "compute/ops/bag_rows.h"
#include "compute/ops/input_grad.h"
#include "compute/ops/row_windows.h"

namespace tessera {

namespace {
struct Push {
  uint32_t rows, width, accumulate, columns;
};
// Of the kernels that read the features: the rows of their window too.
struct WindowPush {
  uint32_t rows, width, accumulate, columns, first, window;
};
}  // namespace

std::unique_ptr<Op> make_attention_pool(const LayerConfig&) { return std::make_unique<AttentionPool>(); }

Shape AttentionPool::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 3 || inputs[0].size() != 2 || inputs[0][1] < 1 || inputs[1].size() != 2 ||
      inputs[0][0] != inputs[1][0] || inputs[2] != Shape{1})
    throw ShapeError("attention_pool takes scores [M,C], features [M,D] and a count [1], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])) +
                     (inputs.size() > 1 ? " and " + to_string(inputs[1]) : std::string()));
  rows_ = inputs[1][0];
  width_ = inputs[1][1];
  columns_ = inputs[0][1];
  return {1, columns_ * width_};
}

std::vector<TensorSpec> AttentionPool::tensors() const {
  return {{"weights", {columns_ * rows_}, TensorRole::saved}, {"instance_grad", {columns_ * rows_}, TensorRole::saved}};
}

void AttentionPool::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  Push push{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), 0, static_cast<uint32_t>(columns_)};
  const vk::Buffer& count = t.inputs[2]->buffer();
  const vk::Buffer& weights = t.tensors[0]->buffer();
  // A workgroup a column for its softmax, and for every 16 features of each column's pool.
  recorder.dispatch(kernel_for<Push>(kernels, vk::kernel::attention_pool_softmax, *t.inputs[0]),
                    {reads(*t.inputs[0]), vk::reads(count), vk::writes(weights)}, push,
                    static_cast<uint32_t>(columns_));
  for (RowWindow window : row_windows(kernels.tile_target(), *t.inputs[1], rows_)) {
    WindowPush windowed{push.rows, push.width, window.first > 0 ? 1u : 0u, push.columns, window.first, window.rows};
    recorder.dispatch(kernel_for<WindowPush>(kernels, vk::kernel::attention_pool_forward, *t.output),
                      {vk::reads(weights), reads_rows(*t.inputs[1], rows_, window), vk::reads(count),
                       window.first > 0 ? updates(*t.output) : writes(*t.output)},
                      windowed, bag_column_groups(width_), static_cast<uint32_t>(columns_));
  }
}

void AttentionPool::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  // The forward pass's push, with each gradient's accumulate flag.
  auto push = [&](uint32_t accumulate) {
    return Push{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), accumulate, static_cast<uint32_t>(columns_)};
  };
  const vk::Buffer& count = t.inputs[2]->buffer();
  const vk::Buffer& weights = t.tensors[0]->buffer();
  const vk::Buffer& instance_grad = t.tensors[1]->buffer();
  const Tensor& dz = *t.output_grad;
  if (t.input_grads[0]) {
    for (RowWindow window : row_windows(kernels.tile_target(), *t.inputs[1], rows_)) {
      WindowPush windowed{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), 0, static_cast<uint32_t>(columns_),
                          window.first, window.rows};
      recorder.dispatch_elements(
          kernel_for<WindowPush>(kernels, vk::kernel::attention_pool_backward_dot, dz, {kElementwiseGroup}),
          {reads(dz), reads_rows(*t.inputs[1], rows_, window), vk::writes(instance_grad)},
          windowed, columns_ * window.rows, kElementwiseGroup);
    }
    recorder.dispatch(kernel_for<Push>(kernels, vk::kernel::attention_pool_backward_scores, *t.input_grads[0]),
                      {vk::reads(weights), vk::reads(instance_grad), vk::reads(count), input_grad_arg(t, 0)},
                      push(accumulates(t, 0)), static_cast<uint32_t>(columns_));
  }
  if (t.input_grads[1]) {
    recorder.dispatch_elements(kernel_for<Push>(kernels, vk::kernel::attention_pool_backward_features, *t.input_grads[1],
                                          {kElementwiseGroup}),
                               {vk::reads(weights), reads(dz), input_grad_arg(t, 1)},
                               push(accumulates(t, 1)), rows_ * width_, kElementwiseGroup);
  }
}

}  // namespace tessera
