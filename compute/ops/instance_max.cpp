#include "compute/ops/instance_max.h"

#include "compute/ops/bag_rows.h"
#include "compute/ops/input_grad.h"
#include "compute/ops/row_windows.h"

namespace tessera {

namespace {
struct Push {
  uint32_t rows, width, accumulate;
};
// Forward's: the rows of the features' window too.
struct WindowPush {
  uint32_t rows, width, accumulate, first, window;
};
}  // namespace

std::unique_ptr<Op> make_instance_max(const LayerConfig&) { return std::make_unique<InstanceMax>(); }

Shape InstanceMax::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 2 || inputs[0].size() != 2 || inputs[1] != Shape{1})
    throw ShapeError("instance_max takes features [M,D] and a count [1], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])));
  rows_ = inputs[0][0];
  width_ = inputs[0][1];
  return {1, width_};
}

std::vector<TensorSpec> InstanceMax::tensors() const {
  return {{"argmax", {width_}, TensorRole::saved, DType::u32}};
}

// A workgroup for every 16 features, as instance_mean.
void InstanceMax::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  auto kernel = kernel_for<WindowPush>(kernels, vk::kernel::instance_max_forward, *t.output);
  for (RowWindow window : row_windows(kernels.tile_target(), *t.inputs[0], rows_)) {
    const bool compares = window.first > 0;  // with the maxima of the windows before it
    recorder.dispatch(kernel,
                      {reads_rows(*t.inputs[0], rows_, window), reads(*t.inputs[1]),
                       compares ? updates(*t.tensors[0]) : writes(*t.tensors[0]), compares ? updates(*t.output) : writes(*t.output)},
                      WindowPush{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), compares ? 1u : 0u, window.first,
                           window.rows},
                      bag_column_groups(width_));
  }
}

void InstanceMax::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  if (!t.input_grads[0]) return;
  auto kernel = kernel_for<Push>(kernels, vk::kernel::instance_max_backward, *t.output_grad, {kElementwiseGroup});
  recorder.dispatch_elements(kernel, {reads(*t.output_grad), reads(*t.tensors[0]), input_grad_arg(t, 0)},
                             Push{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), accumulates(t, 0)},
                             rows_ * width_, kElementwiseGroup);
}

}  // namespace tessera
