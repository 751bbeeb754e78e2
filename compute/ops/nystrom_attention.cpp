#include "compute/ops/nystrom_attention.h"

#include <cmath>

#include "compute/ops/input_grad.h"
#include "compute/ops/layer_norm.h"

namespace tessera {

namespace {

// The tensors() slots, in order.
enum Slot : size_t {
  kWeight,
  kQueryLandmarks, kKeyLandmarks,
  kAttention1, kAttention2, kAttention3,  // softmax(q kl^T) [h, S, m], softmax(ql kl^T) [h, m, m], softmax(ql k^T) [h, m, S]
  kPinvScales, kPinvZ, kPinvXz, kPinvT1, kPinvT2, kPinvT3,  // the iterates of moore_penrose_iter_pinv
  kValues, kMixed,  // w = attention3 v, y = pinv w [h, m, d]
  kGradAttention1, kGradAttention2, kGradAttention3, kGradPinv, kGradT3, kGradT2, kGradXz,
  kGradMixed, kGradValues, kGradQueryLandmarks, kGradKeyLandmarks,
  kClassWeights, kTokenAttention,  // class_attention: row 0 of a1 pinv [h, m], then of a1 pinv a3 [h, S]
};

// Element (b, r, c) of a batched matrix is at offset + b * batch + r * row + c * col.
struct Operand {
  const Tensor* tensor;
  uint32_t offset, batch, row, col;
};

// Which dimensions of a product end at the sequence's length (shaders/batched_product.comp).
enum Dynamic : uint32_t { kStatic = 0, kRows = 1, kColumns = 2, kDepth = 4 };

struct ProductPush {
  uint32_t M, N, K, dynamic;
  uint32_t a_offset, a_batch, a_row, a_col;
  uint32_t b_offset, b_batch, b_row, b_col;
  uint32_t c_offset, c_batch, c_row, c_col;
  float alpha, diagonal;
  uint32_t accumulate;
};

// The recording of one pass: the products and softmaxes of every head at once (z workgroups).
class Recording {
 public:
  Recording(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, uint32_t heads, uint32_t landmarks)
      : recorder_(recorder), kernels_(kernels), t_(t), heads_(heads), landmarks_(landmarks) {}

  const Tensor& slot(Slot s) const { return *t_.tensors[s]; }
  vk::BufferArg reads_count() const { return vk::reads(t_.inputs[1]->buffer()); }

  // c (+)= alpha a b + diagonal I for every head.
  void product(uint32_t M, uint32_t N, uint32_t K, uint32_t dynamic, Operand a, Operand b, Operand c, float alpha,
               bool accumulate, float diagonal = 0) {
    auto kernel = kernel_for<ProductPush>(kernels_, vk::kernel::batched_product, *c.tensor);
    constexpr uint32_t kBlock = 32;  // the kernel's outputs a workgroup: 8 x 8 invocations of 4 x 4
    recorder_.dispatch(kernel, {reads(*a.tensor), reads(*b.tensor), reads_count(), accumulate ? updates(*c.tensor) : writes(*c.tensor)},
                       ProductPush{M, N, K, dynamic, a.offset, a.batch, a.row, a.col, b.offset, b.batch, b.row, b.col,
                                   c.offset, c.batch, c.row, c.col, alpha, diagonal, accumulate ? 1u : 0u},
                       (N + kBlock - 1) / kBlock, (M + kBlock - 1) / kBlock, heads_);
  }

  // Each row of x [heads, rows, length] its softmax, in place.
  void softmax(const Tensor& x, uint32_t rows, uint32_t length, uint32_t dynamic, bool padded) {
    struct Push {
      uint32_t rows, length, dynamic, padded, landmarks;
    };
    auto [x_groups, y_groups] = vk::Recorder::element_groups(rows, 1);
    recorder_.dispatch(kernels_.get<Push>(vk::kernel::nystrom_softmax, row_constants(kernels_, length)), {updates(x), reads_count()},
                       Push{rows, length, dynamic, padded ? 1u : 0u, landmarks_}, x_groups, y_groups, heads_);
  }

  // g (the gradient of softmax a, [heads, rows, length]) becomes the scores' gradient, in place.
  void softmax_backward(const Tensor& a, const Tensor& g, uint32_t rows, uint32_t length) {
    struct Push {
      uint32_t rows, length;
    };
    auto [x_groups, y_groups] = vk::Recorder::element_groups(rows, 1);
    recorder_.dispatch(kernels_.get<Push>(vk::kernel::nystrom_softmax_backward, row_constants(kernels_, length)), {reads(a), updates(g)},
                       Push{rows, length}, x_groups, y_groups, heads_);
  }

 private:
  vk::Recorder& recorder_;
  vk::Kernels& kernels_;
  const OpTensors& t_;
  uint32_t heads_, landmarks_;
};

}  // namespace

std::unique_ptr<Op> make_nystrom_attention(const LayerConfig& layer) {
  return std::make_unique<NystromAttention>(layer.integer("heads", 8, 1), layer.integer("landmarks", 256, 1),
                                            layer.integer("pinv_iterations", 6, 1, 64), layer.integer("residual_kernel", 33, 1),
                                            layer.choice("output", "values", {"values", "class_attention"}) == "class_attention");
}

Shape NystromAttention::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 2 || inputs[0].size() != 3 || inputs[0][0] != 1 || inputs[1] != Shape{1})
    throw ShapeError("nystrom_attention takes qkv [1, S, 3D] and a count [1], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])));
  if (inputs[0][2] % (3 * heads_) != 0)
    throw ShapeError("nystrom_attention: qkv's " + std::to_string(inputs[0][2]) + " features are not 3 x " +
                     std::to_string(heads_) + " heads x a head's width");
  if (kernel_ % 2 == 0) throw ShapeError("nystrom_attention: residual_kernel must be odd (its padding is kernel / 2)");
  rows_ = inputs[0][1];
  width_ = inputs[0][2] / 3;
  head_dim_ = width_ / heads_;
  if (class_attention_) return {rows_ - 1, 1};
  return {1, rows_, width_};
}

std::vector<TensorSpec> NystromAttention::tensors() const {
  float bound = 1.0f / std::sqrt(static_cast<float>(kernel_));  // Conv2d's default for fan_in = kernel
  int64_t h = heads_, m = landmarks_, d = head_dim_, s = rows_;
  auto saved = [](const char* name, Shape shape) { return TensorSpec{name, std::move(shape), TensorRole::saved}; };
  auto backward_scratch = [&](const char* name, Shape shape) {
    TensorSpec spec = saved(name, std::move(shape));
    spec.training_only = true;
    return spec;
  };
  auto class_scratch = [&](const char* name, Shape shape) {  // class_attention's, which never trains
    TensorSpec spec = saved(name, std::move(shape));
    spec.inference_only = true;
    return spec;
  };
  return {{"res_conv.weight", {h, 1, kernel_, 1}, TensorRole::parameter, DType::f32, {Init::uniform, bound}},
          saved("q_landmarks", {h, m, d}), saved("k_landmarks", {h, m, d}),
          saved("attention1", {h, s, m}), saved("attention2", {h, m, m}), saved("attention3", {h, m, s}),
          saved("pinv_scales", {3}), saved("pinv_z", {iterations_ + 1, h, m, m}),
          saved("pinv_xz", {iterations_, h, m, m}), saved("pinv_t1", {iterations_, h, m, m}),
          saved("pinv_t2", {iterations_, h, m, m}), saved("pinv_t3", {iterations_, h, m, m}),
          saved("values", {h, m, d}), saved("mixed", {h, m, d}),
          backward_scratch("grad_attention1", {h, s, m}), backward_scratch("grad_attention2", {h, m, m}),
          backward_scratch("grad_attention3", {h, m, s}), backward_scratch("grad_pinv", {2, h, m, m}),
          backward_scratch("grad_t3", {h, m, m}), backward_scratch("grad_t2", {h, m, m}),
          backward_scratch("grad_xz", {h, m, m}), backward_scratch("grad_mixed", {h, m, d}),
          backward_scratch("grad_values", {h, m, d}), backward_scratch("grad_q_landmarks", {h, m, d}),
          backward_scratch("grad_k_landmarks", {h, m, d}),
          class_scratch("class_weights", {h, m}), class_scratch("token_attention", {h, s})};
}

double NystromAttention::forward_flops() const {
  double s = static_cast<double>(rows_), m = static_cast<double>(landmarks_), d = static_cast<double>(head_dim_);
  double per_head = 2 * (s * m * d * 3 + m * m * d + m * m * m * 4 * static_cast<double>(iterations_) + m * m * d) +
                    2 * s * d * static_cast<double>(kernel_);
  return per_head * static_cast<double>(heads_);
}

void NystromAttention::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const auto S = static_cast<uint32_t>(rows_), D = static_cast<uint32_t>(width_), d = static_cast<uint32_t>(head_dim_),
             m = static_cast<uint32_t>(landmarks_), H = static_cast<uint32_t>(heads_);
  Recording r(recorder, kernels, t, H, m);
  const Tensor& qkv = *t.inputs[0];
  float scale = 1.0f / std::sqrt(static_cast<float>(d));
  struct LandmarkPush {
    uint32_t heads, head_dim, landmarks, width;
    float scale;
  };
  recorder.dispatch_elements(kernels.get<LandmarkPush>(vk::kernel::nystrom_landmarks, {kElementwiseGroup}),
                             {reads(qkv), r.reads_count(), writes(r.slot(kQueryLandmarks)), writes(r.slot(kKeyLandmarks))},
                             LandmarkPush{H, d, m, D, scale}, uint64_t{H} * m * d, kElementwiseGroup);
  const uint32_t mm = m * m, md = m * d, sm = S * m, stride = 3 * D;
  Operand queries{&qkv, 0, d, stride, 1}, keys_t{&qkv, D, d, 1, stride}, values{&qkv, 2 * D, d, stride, 1};
  Operand ql{&r.slot(kQueryLandmarks), 0, md, d, 1}, kl_t{&r.slot(kKeyLandmarks), 0, md, 1, d};
  Operand a1{&r.slot(kAttention1), 0, sm, m, 1}, a2{&r.slot(kAttention2), 0, mm, m, 1}, a3{&r.slot(kAttention3), 0, sm, S, 1};
  r.product(S, m, d, kRows, queries, kl_t, a1, scale, false);
  r.softmax(*a1.tensor, S, m, kRows, false);
  r.product(m, m, d, kStatic, ql, kl_t, a2, 1, false);
  r.softmax(*a2.tensor, m, m, kStatic, false);
  r.product(m, S, d, kColumns, ql, keys_t, a3, 1, false);
  r.softmax(*a3.tensor, m, S, kColumns, true);
  // z_{k+1} = z_k (13 I - xz (15 I - xz (7 I - xz))) / 4, xz = a2 z_k
  struct PinvPush {
    uint32_t heads, side;
  };
  recorder.dispatch(kernels.get<PinvPush>(vk::kernel::nystrom_pinv_init),
                    {reads(r.slot(kAttention2)), writes(r.slot(kPinvZ)), writes(r.slot(kPinvScales))}, PinvPush{H, m}, 1);
  const uint32_t step = H * mm;
  struct IdentityPush {
    uint32_t offset, size, side;
    float scale;
  };
  for (uint32_t k = 0; k < static_cast<uint32_t>(iterations_); ++k) {
    Operand z{&r.slot(kPinvZ), k * step, mm, m, 1}, next{&r.slot(kPinvZ), (k + 1) * step, mm, m, 1};
    Operand xz{&r.slot(kPinvXz), k * step, mm, m, 1}, t1{&r.slot(kPinvT1), k * step, mm, m, 1};
    Operand t2{&r.slot(kPinvT2), k * step, mm, m, 1}, t3{&r.slot(kPinvT3), k * step, mm, m, 1};
    r.product(m, m, m, kStatic, a2, z, xz, 1, false);
    recorder.dispatch_elements(kernels.get<IdentityPush>(vk::kernel::nystrom_identity_minus, {kElementwiseGroup}),
                               {reads(*xz.tensor), updates(*t1.tensor)}, IdentityPush{k * step, step, m, 7}, step,
                               kElementwiseGroup);
    r.product(m, m, m, kStatic, xz, t1, t2, -1, false, 15);
    r.product(m, m, m, kStatic, xz, t2, t3, -1, false, 13);
    r.product(m, m, m, kStatic, z, t3, next, 0.25f, false);
  }
  Operand pinv{&r.slot(kPinvZ), static_cast<uint32_t>(iterations_) * step, mm, m, 1};
  if (class_attention_) {
    Operand weights{&r.slot(kClassWeights), 0, m, m, 1}, tokens{&r.slot(kTokenAttention), 0, S, S, 1};
    r.product(1, m, m, kStatic, a1, pinv, weights, 1, false);
    r.product(1, S, m, kColumns, weights, a3, tokens, 1, false);
    struct ClassPush {
      uint32_t patches_max, rows, heads;
    };
    recorder.dispatch_elements(kernel_for<ClassPush>(kernels, vk::kernel::nystrom_class_attention, *t.output, {kElementwiseGroup}),
                               {reads(*tokens.tensor), r.reads_count(), writes(*t.output)}, ClassPush{S - 1, S, H}, S - 1,
                               kElementwiseGroup);
    return;
  }
  Operand w{&r.slot(kValues), 0, md, d, 1}, y{&r.slot(kMixed), 0, md, d, 1};
  r.product(m, d, S, kDepth, a3, values, w, 1, false);
  r.product(m, d, m, kStatic, pinv, w, y, 1, false);
  r.product(S, d, m, kRows, a1, y, Operand{t.output, 0, d, D, 1}, 1, false);
  struct ResidualPush {
    uint32_t rows, head_dim, width, kernel;
  };
  recorder.dispatch_elements(kernel_for<ResidualPush>(kernels, vk::kernel::nystrom_residual, *t.output, {kElementwiseGroup}),
                             {reads(qkv), reads(r.slot(kWeight)), r.reads_count(), updates(*t.output)},
                             ResidualPush{S, d, D, static_cast<uint32_t>(kernel_)}, uint64_t{S} * D, kElementwiseGroup);
}

// The forward pass's products in reverse (the header's names): out = a1 y, y = pinv w,
// w = a3 v, the pseudo-inverse's iterations and its start, the three softmaxes, the scores
// q kl^T, ql kl^T, ql k^T, and the landmarks' means; then the residual convolution's share.
void NystromAttention::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const auto S = static_cast<uint32_t>(rows_), D = static_cast<uint32_t>(width_), d = static_cast<uint32_t>(head_dim_),
             m = static_cast<uint32_t>(landmarks_), H = static_cast<uint32_t>(heads_);
  Recording r(recorder, kernels, t, H, m);
  const Tensor& qkv = *t.inputs[0];
  const Tensor& dout = *t.output_grad;
  float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const uint32_t mm = m * m, md = m * d, sm = S * m, stride = 3 * D, step = H * mm;
  const auto iterations = static_cast<uint32_t>(iterations_);
  auto square = [&](Slot s, uint32_t offset = 0) { return Operand{&r.slot(s), offset, mm, m, 1}; };
  auto square_t = [&](Slot s, uint32_t offset = 0) { return Operand{&r.slot(s), offset, mm, 1, m}; };
  auto narrow = [&](Slot s) { return Operand{&r.slot(s), 0, md, d, 1}; };    // [h, m, d]
  auto narrow_t = [&](Slot s) { return Operand{&r.slot(s), 0, md, 1, d}; };  // its transpose [h, d, m]
  Operand queries{&qkv, 0, d, stride, 1}, keys{&qkv, D, d, stride, 1};
  Operand values_t{&qkv, 2 * D, d, 1, stride}, dout_heads{&dout, 0, d, D, 1};
  Operand a1{&r.slot(kAttention1), 0, sm, m, 1}, a1_t{&r.slot(kAttention1), 0, sm, 1, m};
  Operand a3_t{&r.slot(kAttention3), 0, sm, 1, S};
  Operand g1{&r.slot(kGradAttention1), 0, sm, m, 1}, g1_t{&r.slot(kGradAttention1), 0, sm, 1, m};
  Operand g3{&r.slot(kGradAttention3), 0, sm, S, 1}, g3_t{&r.slot(kGradAttention3), 0, sm, 1, S};
  Operand pinv_t = square_t(kPinvZ, iterations * step);

  // out = a1 y
  r.product(S, m, d, kRows, dout_heads, narrow_t(kMixed), g1, 1, false);
  r.product(m, d, S, kDepth, a1_t, dout_heads, narrow(kGradMixed), 1, false);
  r.softmax_backward(*a1.tensor, *g1.tensor, S, m);
  // y = pinv w
  r.product(m, d, m, kStatic, pinv_t, narrow(kGradMixed), narrow(kGradValues), 1, false);
  uint32_t current = 0;  // which half of grad_pinv holds the gradient of the latest iterate
  r.product(m, m, d, kStatic, narrow(kGradMixed), narrow_t(kValues), square(kGradPinv), 1, false);
  // z' = z t3 / 4, t3 = 13 I - xz t2, t2 = 15 I - xz t1, t1 = 7 I - xz, xz = a2 z
  for (uint32_t k = iterations; k-- > 0;) {
    uint32_t at = k * step, next = current * step, earlier = (1 - current) * step;
    Operand dnext = square(kGradPinv, next), dz = square(kGradPinv, earlier);
    r.product(m, m, m, kStatic, dnext, square_t(kPinvT3, at), dz, 0.25f, false);
    r.product(m, m, m, kStatic, square_t(kPinvZ, at), dnext, square(kGradT3), 0.25f, false);
    r.product(m, m, m, kStatic, square(kGradT3), square_t(kPinvT2, at), square(kGradXz), -1, false);
    r.product(m, m, m, kStatic, square_t(kPinvXz, at), square(kGradT3), square(kGradT2), -1, false);
    r.product(m, m, m, kStatic, square(kGradT2), square_t(kPinvT1, at), square(kGradXz), -1, true);
    // t1 = 7 I - xz: dxz -= dt1, dt1 = -xz^T dt2
    r.product(m, m, m, kStatic, square_t(kPinvXz, at), square(kGradT2), square(kGradXz), 1, true);
    r.product(m, m, m, kStatic, square(kGradXz), square_t(kPinvZ, at), square(kGradAttention2), 1, k + 1 < iterations);
    r.product(m, m, m, kStatic, square_t(kAttention2), square(kGradXz), dz, 1, true);
    current = 1 - current;
  }
  struct PinvPush {
    uint32_t heads, side, dz_offset;
  };
  recorder.dispatch(kernels.get<PinvPush>(vk::kernel::nystrom_pinv_init_backward),
                    {reads(r.slot(kAttention2)), reads(r.slot(kGradPinv)), reads(r.slot(kPinvScales)),
                     updates(r.slot(kGradAttention2))},
                    PinvPush{H, m, current * step}, 1);
  r.softmax_backward(r.slot(kAttention2), r.slot(kGradAttention2), m, m);
  // w = a3 v
  r.product(m, S, d, kColumns, narrow(kGradValues), values_t, g3, 1, false);
  r.product(S, d, m, kRows, a3_t, narrow(kGradValues), Operand{t.input_grads[0], 2 * D, d, stride, 1}, 1,
            t.accumulate_input_grads[0]);
  r.softmax_backward(r.slot(kAttention3), *g3.tensor, m, S);
  // scores: a1 from q kl^T (q scaled), a2 from ql kl^T, a3 from ql k^T
  r.product(m, d, m, kStatic, square(kGradAttention2), narrow(kKeyLandmarks), narrow(kGradQueryLandmarks), 1, false);
  r.product(m, d, S, kDepth, g3, keys, narrow(kGradQueryLandmarks), 1, true);
  r.product(m, d, m, kStatic, square_t(kGradAttention2), narrow(kQueryLandmarks), narrow(kGradKeyLandmarks), 1, false);
  r.product(m, d, S, kDepth, g1_t, queries, narrow(kGradKeyLandmarks), scale, true);
  r.product(S, d, m, kRows, g1, narrow(kKeyLandmarks), Operand{t.input_grads[0], 0, d, stride, 1}, scale,
            t.accumulate_input_grads[0]);
  r.product(S, d, m, kRows, g3_t, narrow(kQueryLandmarks), Operand{t.input_grads[0], D, d, stride, 1}, 1,
            t.accumulate_input_grads[0]);
  struct LandmarkPush {
    uint32_t rows, heads, head_dim, landmarks, width;
    float scale;
  };
  const Tensor& dqkv = *t.input_grads[0];
  recorder.dispatch_elements(
      kernel_for<LandmarkPush>(kernels, vk::kernel::nystrom_landmarks_backward, dqkv, {kElementwiseGroup}),
      {reads(r.slot(kGradQueryLandmarks)), reads(r.slot(kGradKeyLandmarks)), r.reads_count(), updates(dqkv)},
      LandmarkPush{S, H, d, m, D, scale}, uint64_t{S} * 2 * D, kElementwiseGroup);
  // the residual convolution of v
  struct ResidualPush {
    uint32_t rows, head_dim, width, kernel;
  };
  const auto kernel = static_cast<uint32_t>(kernel_);
  recorder.dispatch_elements(kernel_for<ResidualPush>(kernels, vk::kernel::nystrom_residual_backward, dqkv, {kElementwiseGroup}),
                             {reads(dout), reads(r.slot(kWeight)), r.reads_count(), updates(dqkv)},
                             ResidualPush{S, d, D, kernel}, uint64_t{S} * D, kElementwiseGroup);
  struct WeightPush {
    uint32_t head_dim, width, kernel;
  };
  recorder.dispatch(kernels.get<WeightPush>(vk::kernel::nystrom_residual_weight_backward),
                    {reads(dout), reads(qkv), r.reads_count(), updates(*t.grads[kWeight])}, WeightPush{d, D, kernel},
                    H * kernel);
}

}  // namespace tessera
