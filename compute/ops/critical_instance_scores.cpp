#include "compute/ops/critical_instance_scores.h"

#include "compute/ops/bag_rows.h"
#include "compute/ops/input_grad.h"

namespace tessera {

namespace {
struct Push {
  uint32_t rows, width, classes, accumulate;
};
}  // namespace

std::unique_ptr<Op> make_critical_instance_scores(const LayerConfig&) {
  return std::make_unique<CriticalInstanceScores>();
}

Shape CriticalInstanceScores::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 3 || inputs[0].size() != 2 || inputs[1].size() != 2 || inputs[0][0] != inputs[1][0] ||
      inputs[0][1] < 1 || inputs[1][1] < 1 || inputs[2] != Shape{1})
    throw ShapeError("critical_instance_scores takes queries [M,K], instance logits [M,C] and a count [1], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])) +
                     (inputs.size() > 1 ? " and " + to_string(inputs[1]) : std::string()));
  rows_ = inputs[0][0];
  width_ = inputs[0][1];
  classes_ = inputs[1][1];
  return {rows_, classes_};
}

std::vector<TensorSpec> CriticalInstanceScores::tensors() const {
  return {{"critical", {classes_}, TensorRole::saved, DType::u32},
          {"gathered", {classes_ * width_}, TensorRole::saved}};
}

void CriticalInstanceScores::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  Push push{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), static_cast<uint32_t>(classes_), 0};
  const Tensor& critical = *t.tensors[0];
  // A workgroup for every 16 classes, as instance_max.
  recorder.dispatch(kernel_for<Push>(kernels, vk::kernel::critical_instance_scores_argmax, *t.inputs[1]),
                    {reads(*t.inputs[1]), reads(*t.inputs[2]), writes(critical)}, push, bag_column_groups(classes_));
  recorder.dispatch_elements(
      kernel_for<Push>(kernels, vk::kernel::critical_instance_scores_forward, *t.output, {kElementwiseGroup}),
      {reads(*t.inputs[0]), reads(critical), reads(*t.inputs[2]), writes(*t.output)}, push, rows_ * classes_,
      kElementwiseGroup);
}

void CriticalInstanceScores::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const Tensor& critical = *t.tensors[0];
  const Tensor& gathered = *t.tensors[1];
  if (t.input_grads[0]) {
    Push push{static_cast<uint32_t>(rows_), static_cast<uint32_t>(width_), static_cast<uint32_t>(classes_),
              accumulates(t, 0)};
    // sum_n ds[n, c] Q[n] / sqrt(K) for each class first: what each critical row gets besides
    // its own term.
    const Tensor& ds = *t.output_grad;
    recorder.dispatch(kernel_for<Push>(kernels, vk::kernel::critical_instance_scores_backward_gather, ds),
                      {reads(ds), reads(*t.inputs[0]), reads(*t.inputs[2]), writes(gathered)}, push,
                      bag_column_groups(width_), static_cast<uint32_t>(classes_));
    recorder.dispatch_elements(
        kernel_for<Push>(kernels, vk::kernel::critical_instance_scores_backward_queries, ds, {kElementwiseGroup}),
        {reads(ds), reads(*t.inputs[0]), reads(critical), reads(gathered), reads(*t.inputs[2]),
         input_grad_arg(t, 0)},
        push, rows_ * width_, kElementwiseGroup);
  }
  // No gradient through the argmax: where this op is the first to write the logits' gradient,
  // it writes zeros for the others to add to.
  if (t.input_grads[1] && !t.accumulate_input_grads[1]) recorder.fill(t.input_grads[1]->buffer(), 0);
}

}  // namespace tessera
