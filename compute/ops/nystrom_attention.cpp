#include "compute/ops/nystrom_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "compute/ops/gemm.h"
#include "compute/ops/layer_norm.h"

namespace tessera {

namespace {

// The tensors() slots, in order.
enum Slot : size_t {
  kProjection,  // to_qkv.weight [3D, D]: W_q, W_k and W_v, each [D, D], one after another
  kWeight,      // res_conv.weight
  kQ, kK, kV,   // the projections [S, D], computed in each pass that reads them
  kQueryLandmarks, kKeyLandmarks,
  kScores,  // a chunk of softmax(q kl^T) [h, C, m] or of softmax(ql k^T) [h, m, C]
  kAttention2,  // softmax(ql kl^T) [h, m, m]
  kStats3,  // each row of softmax(ql k^T): its maximum and sum of exponentials [h, m, 2]
  kPinvScales, kPinvZ, kPinvXz, kPinvT1, kPinvT2, kPinvT3,  // the iterates of moore_penrose_iter_pinv
  kValues, kMixed,  // w = softmax(ql k^T) v, y = pinv w [h, m, d]
  kGradQ,  // dk and dv take the buffers of q and v in backward (NystromAttention::backward)
  kGradScores, kGradAttention2, kGradPinv, kGradT3, kGradT2, kGradXz,
  kGradMixed, kGradValues, kGradQueryLandmarks, kGradKeyLandmarks,
  kClassWeights, kTokenAttention,  // class_attention: row 0 of a1 pinv [h, m], then of a1 pinv a3 [h, S]
};

// A chunk's scores take at most this many floats (32 MiB), unless a chunk_rows asks otherwise.
constexpr int64_t kChunkFloats = int64_t{1} << 23;

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
  uint32_t accumulate, start;
};

// softmax_stats's modes (shaders/nystrom_softmax_stats.comp).
enum StatsMode : uint32_t { kStartStats = 0, kFoldStats = 1, kApplyStats = 2 };

// The recording of one pass: the products and softmaxes of every head at once (z workgroups).
class Recording {
 public:
  Recording(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, uint32_t heads, uint32_t landmarks)
      : recorder_(recorder), kernels_(kernels), t_(t), heads_(heads), landmarks_(landmarks) {}

  const Tensor& slot(Slot s) const { return *t_.tensors[s]; }
  vk::BufferArg reads_count() const { return vk::reads(t_.inputs[1]->buffer()); }

  // c (+)= alpha a b + diagonal I for every head; a dynamic dimension holds the sequence's rows
  // from `start` on.
  void product(uint32_t M, uint32_t N, uint32_t K, uint32_t dynamic, Operand a, Operand b, Operand c, float alpha,
               bool accumulate, float diagonal = 0, uint32_t start = 0) {
    auto quads = quad_layout(M, N, K, a, b);
    auto kernel = quads ? kernel_for<ProductPush>(kernels_, vk::kernel::batched_product_quads, *c.tensor, *b.tensor,
                                                  {quads->first ? 1 : 0, quads->second ? 1 : 0})
                        : kernel_for<ProductPush>(kernels_, vk::kernel::batched_product, *c.tensor, *b.tensor);
    auto operand = [&](const Tensor& x) { return quads ? reads_quads(x) : reads(x); };
    constexpr uint32_t kBlock = 32;  // either kernel's outputs a workgroup: 8 x 8 invocations of 4 x 4
    recorder_.dispatch(kernel, {operand(*a.tensor), operand(*b.tensor), reads_count(), accumulate ? updates(*c.tensor) : writes(*c.tensor)},
                       ProductPush{M, N, K, dynamic, a.offset, a.batch, a.row, a.col, b.offset, b.batch, b.row, b.col,
                                   c.offset, c.batch, c.row, c.col, alpha, diagonal, accumulate ? 1u : 0u, start},
                       (N + kBlock - 1) / kBlock, (M + kBlock - 1) / kBlock, heads_);
  }

  // Where a product reads texels of four elements (shaders/batched_product_quads.comp): on
  // CPU-like devices, M, N and K multiples of 4, each operand contiguous along one of its
  // dimensions and its other strides multiples of 4. Whether A and B are contiguous along k
  // (else along m and n), or nothing where the plain kernel serves.
  std::optional<std::pair<bool, bool>> quad_layout(uint32_t M, uint32_t N, uint32_t K, const Operand& a,
                                                   const Operand& b) const {
    if (!kernels_.tile_target().cpu_like() || M % 4 || N % 4 || K % 4 || M == 0 || N == 0 || K == 0) return {};
    // Texels of x contiguous along the dimension of stride `along`, every head's within the tensor.
    auto quads = [&](const Operand& x, uint32_t along, uint32_t across, uint32_t rows, uint32_t columns) {
      uint64_t last = x.offset + uint64_t{heads_ - 1} * x.batch + uint64_t{rows - 1} * x.row + uint64_t{columns - 1} * x.col;
      return along == 1 && x.offset % 4 == 0 && x.batch % 4 == 0 && across % 4 == 0 && last < static_cast<uint64_t>(x.tensor->count());
    };
    bool a_along_k = quads(a, a.col, a.row, M, K), b_along_k = quads(b, b.row, b.col, K, N);
    if (!(a_along_k || quads(a, a.row, a.col, M, K)) || !(b_along_k || quads(b, b.col, b.row, K, N))) return {};
    return std::pair{a_along_k, b_along_k};
  }

  // Each row of x [heads, rows, length] its softmax, in place; with dynamic_rows the rows are
  // the sequence's from `start` on.
  void softmax(const Tensor& x, uint32_t rows, uint32_t length, bool dynamic_rows, uint32_t start = 0) {
    struct Push {
      uint32_t rows, length, dynamic_rows, start;
    };
    auto [x_groups, y_groups] = vk::Recorder::element_groups(rows, 1);
    recorder_.dispatch(kernels_.get<Push>(vk::kernel::nystrom_softmax, row_constants(kernels_, length)), {updates(x), reads_count()},
                       Push{rows, length, dynamic_rows ? 1u : 0u, start}, x_groups, y_groups, heads_);
  }

  // softmax(ql k^T) over the columns start .. start + length held in scores [heads, m, length]:
  // its row statistics started or folded in, or the chunk made its values.
  void softmax_stats(uint32_t length, uint32_t start, StatsMode mode) {
    struct Push {
      uint32_t rows, length, start, landmarks, mode;
    };
    auto [x_groups, y_groups] = vk::Recorder::element_groups(landmarks_, 1);
    recorder_.dispatch(kernels_.get<Push>(vk::kernel::nystrom_softmax_stats, row_constants(kernels_, length)),
                       {updates(slot(kScores)), updates(slot(kStats3)), reads_count()},
                       Push{landmarks_, length, start, landmarks_, mode}, x_groups, y_groups, heads_);
  }

  // g (the gradient of softmax a, [heads, rows, length]) becomes the scores' gradient, in place;
  // with head_dim, a's rows span chunks and their sums come from dw and w (grad_values, values).
  void softmax_backward(const Tensor& a, const Tensor& g, uint32_t rows, uint32_t length, uint32_t head_dim = 0) {
    struct Push {
      uint32_t rows, length, head_dim;
    };
    auto [x_groups, y_groups] = vk::Recorder::element_groups(rows, 1);
    recorder_.dispatch(kernels_.get<Push>(vk::kernel::nystrom_softmax_backward, row_constants(kernels_, length)),
                       {reads(a), updates(g), reads(slot(kGradValues)), reads(slot(kValues))}, Push{rows, length, head_dim},
                       x_groups, y_groups, heads_);
  }

 private:
  vk::Recorder& recorder_;
  vk::Kernels& kernels_;
  const OpTensors& t_;
  uint32_t heads_, landmarks_;
};

// The pseudo-inverse of a2 = softmax(ql kl^T) by Newton-Schulz iterations, every iterate kept for
// backward: z_{k+1} = z_k (13 I - xz (15 I - xz (7 I - xz))) / 4, xz = a2 z_k. Backward computes
// them again from a2 rather than keep them from forward (pass scratch: 65 MB a layer at TransMIL's
// 256 landmarks, against about 50 ms of products on lavapipe).
void record_pseudo_inverse(Recording& r, vk::Recorder& recorder, vk::Kernels& kernels, uint32_t H, uint32_t m,
                           uint32_t iterations) {
  const uint32_t mm = m * m, step = H * mm;
  Operand a2{&r.slot(kAttention2), 0, mm, m, 1};
  struct PinvPush {
    uint32_t heads, side;
  };
  recorder.dispatch(kernels.get<PinvPush>(vk::kernel::nystrom_pinv_init),
                    {reads(r.slot(kAttention2)), writes(r.slot(kPinvZ)), writes(r.slot(kPinvScales))}, PinvPush{H, m}, 1);
  struct IdentityPush {
    uint32_t offset, size, side;
    float scale;
  };
  for (uint32_t k = 0; k < iterations; ++k) {
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
}

// Block i of to_qkv.weight [3D, D] (W_q, W_k, W_v: [D, D] each), or of its gradient, as a window
// (D a multiple of 8, so that each block starts 256-byte aligned: NystromAttention::infer).
MatrixView projection_block(const Tensor& weight, size_t i, uint32_t width, bool transposed) {
  const uint64_t block = uint64_t{width} * width;
  return transposed ? MatrixView{&weight, 1, width, i * block, block} : MatrixView{&weight, width, 1, i * block, block};
}

// to_qkv: q, k and v [S, D] = x W^T for each block W. Each pass computes them again rather than
// keep them from forward to backward: three activations of [S, D] for each layer, 300 MB in fp16
// at 100,000 patches, against three products as large as one of to_out's.
void record_projections(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, uint32_t rows, uint32_t width) {
  for (size_t i = 0; i < 3; ++i)  // y^T [D, S] = W [D, D] x^T [D, S], as a linear layer's forward
    record_gemm(recorder, kernels, width, rows, width, projection_block(*t.tensors[kProjection], i, width, false),
                {t.inputs[0], 1, width}, {t.tensors[kQ + i], 1, width}, false);
}

// to_qkv's backward from dq, dk and dv: dx = dq W_q + dk W_k + dv W_v, and each block's gradient
// dW += dy^T x.
void record_projections_backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t, uint32_t rows,
                                 uint32_t width, const std::array<const Tensor*, 3>& grads) {
  if (t.input_grads[0])
    for (size_t i = 0; i < 3; ++i)  // dx^T [D, S] = W^T [D, D] dy^T [D, S]
      record_gemm(recorder, kernels, width, rows, width, projection_block(*t.tensors[kProjection], i, width, true),
                  {grads[i], 1, width}, {t.input_grads[0], 1, width}, i > 0 || t.accumulate_input_grads[0]);
  for (size_t i = 0; i < 3; ++i)
    record_gemm(recorder, kernels, width, width, rows, {grads[i], 1, width}, {t.inputs[0], width, 1},
                projection_block(*t.grads[kProjection], i, width, false), true);
}

// The sequence in chunks of `chunk` rows: each chunk's first row and its rows (the last holds the rest).
std::vector<std::pair<uint32_t, uint32_t>> chunks(int64_t rows, int64_t chunk) {
  std::vector<std::pair<uint32_t, uint32_t>> result;
  for (int64_t first = 0; first < rows; first += chunk)
    result.emplace_back(static_cast<uint32_t>(first), static_cast<uint32_t>(std::min(chunk, rows - first)));
  return result;
}

}  // namespace

std::unique_ptr<Op> make_nystrom_attention(const LayerConfig& layer) {
  using Output = NystromAttention::Output;
  std::string output = layer.choice("output", "values", {"values", "class_token", "class_attention"});
  return std::make_unique<NystromAttention>(
      layer.integer("heads", 8, 1), layer.integer("landmarks", 256, 1), layer.integer("pinv_iterations", 6, 1, 64),
      layer.integer("residual_kernel", 33, 1),
      output == "class_token" ? Output::class_token : output == "class_attention" ? Output::class_attention : Output::values,
      layer.integer("chunk_rows", 0, 0), layer.boolean("recompute", true));
}

Shape NystromAttention::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 2 || inputs[0].size() != 3 || inputs[0][0] != 1 || inputs[1] != Shape{1})
    throw ShapeError("nystrom_attention takes x [1, S, D] and a count [1], got " +
                     (inputs.empty() ? std::string("nothing") : to_string(inputs[0])));
  if (inputs[0][2] % 8 != 0)
    throw ShapeError("nystrom_attention: x's " + std::to_string(inputs[0][2]) +
                     " features are no multiple of 8 (each block of to_qkv.weight starts 256-byte aligned)");
  if (inputs[0][2] % heads_ != 0)
    throw ShapeError("nystrom_attention: x's " + std::to_string(inputs[0][2]) + " features are not " +
                     std::to_string(heads_) + " heads x a head's width");
  if (kernel_ % 2 == 0) throw ShapeError("nystrom_attention: residual_kernel must be odd (its padding is kernel / 2)");
  rows_ = inputs[0][1];
  width_ = inputs[0][2];
  head_dim_ = width_ / heads_;
  chunk_ = std::min(rows_, chunk_rows_ > 0 ? chunk_rows_ : std::max<int64_t>(1, kChunkFloats / (heads_ * landmarks_)));
  if (output_ == Output::class_attention) return {rows_ - 1, 1};
  if (output_ == Output::class_token) return {1, width_};
  return {1, rows_, width_};
}

std::vector<TensorSpec> NystromAttention::tensors() const {
  float bound = 1.0f / std::sqrt(static_cast<float>(kernel_));  // Conv2d's default for fan_in = kernel
  float projection_bound = 1.0f / std::sqrt(static_cast<float>(width_));  // nn.Linear's
  int64_t h = heads_, m = landmarks_, d = head_dim_, s = rows_, D = width_;
  auto saved = [](const char* name, Shape shape) { return TensorSpec{name, std::move(shape), TensorRole::saved}; };
  auto pass_scratch = [&](const char* name, Shape shape, bool activation_typed = false) {
    TensorSpec spec = saved(name, std::move(shape));
    spec.pass_scratch = true;
    spec.activation_typed = activation_typed;
    return spec;
  };
  // What backward reads of forward's: computed again in it (pass scratch), or kept.
  auto forward_product = [&](const char* name, Shape shape, bool activation_typed = false) {
    TensorSpec spec = pass_scratch(name, std::move(shape), activation_typed);
    spec.pass_scratch = recompute_;
    return spec;
  };
  auto backward_scratch = [&](const char* name, Shape shape, bool activation_typed = false) {
    TensorSpec spec = pass_scratch(name, std::move(shape), activation_typed);
    spec.training_only = true;
    return spec;
  };
  auto class_scratch = [&](const char* name, Shape shape) {  // class_attention's, which never trains
    TensorSpec spec = saved(name, std::move(shape));
    spec.inference_only = true;
    return spec;
  };
  return {{"to_qkv.weight", {3 * D, D}, TensorRole::parameter, DType::f32, {Init::uniform, projection_bound}},
          {"res_conv.weight", {h, 1, kernel_, 1}, TensorRole::parameter, DType::f32, {Init::uniform, bound}},
          forward_product("q", {1, s, D}, true), forward_product("k", {1, s, D}, true),
          forward_product("v", {1, s, D}, true),
          saved("q_landmarks", {h, m, d}), saved("k_landmarks", {h, m, d}),
          pass_scratch("scores", {h, chunk_, m}), saved("attention2", {h, m, m}), saved("attention3_stats", {h, m, 2}),
          forward_product("pinv_scales", {3}), forward_product("pinv_z", {iterations_ + 1, h, m, m}),
          forward_product("pinv_xz", {iterations_, h, m, m}), forward_product("pinv_t1", {iterations_, h, m, m}),
          forward_product("pinv_t2", {iterations_, h, m, m}), forward_product("pinv_t3", {iterations_, h, m, m}),
          saved("values", {h, m, d}), saved("mixed", {h, m, d}),
          backward_scratch("grad_q", {1, s, D}, true),
          backward_scratch("grad_scores", {h, chunk_, m}), backward_scratch("grad_attention2", {h, m, m}),
          backward_scratch("grad_pinv", {2, h, m, m}), backward_scratch("grad_t3", {h, m, m}),
          backward_scratch("grad_t2", {h, m, m}), backward_scratch("grad_xz", {h, m, m}),
          backward_scratch("grad_mixed", {h, m, d}), backward_scratch("grad_values", {h, m, d}),
          backward_scratch("grad_q_landmarks", {h, m, d}), backward_scratch("grad_k_landmarks", {h, m, d}),
          class_scratch("class_weights", {h, m}), class_scratch("token_attention", {h, s})};
}

double NystromAttention::forward_flops() const {
  // Over the sequence: q kl^T, ql k^T twice (its statistics, then its values), a3 v and a1 y.
  double s = static_cast<double>(rows_), m = static_cast<double>(landmarks_), d = static_cast<double>(head_dim_);
  double projections = 2 * s * 3 * static_cast<double>(width_ * width_);
  double per_head = 2 * (s * m * d * 5 + m * m * d + m * m * m * 4 * static_cast<double>(iterations_) + m * m * d) +
                    2 * s * d * static_cast<double>(kernel_);
  return projections + per_head * static_cast<double>(heads_);
}

void NystromAttention::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const auto S = static_cast<uint32_t>(rows_), D = static_cast<uint32_t>(width_), d = static_cast<uint32_t>(head_dim_),
             m = static_cast<uint32_t>(landmarks_), H = static_cast<uint32_t>(heads_);
  Recording r(recorder, kernels, t, H, m);
  record_projections(recorder, kernels, t, S, D);
  const Tensor &query = r.slot(kQ), &key = r.slot(kK), &value = r.slot(kV);
  float scale = 1.0f / std::sqrt(static_cast<float>(d));
  struct LandmarkPush {
    uint32_t heads, head_dim, landmarks, width;
    float scale;
  };
  recorder.dispatch_elements(kernels.get<LandmarkPush>(vk::kernel::nystrom_landmarks, {kElementwiseGroup}),
                             {reads(query), reads(key), r.reads_count(), writes(r.slot(kQueryLandmarks)), writes(r.slot(kKeyLandmarks))},
                             LandmarkPush{H, d, m, D, scale}, uint64_t{H} * m * d, kElementwiseGroup);
  const uint32_t mm = m * m, md = m * d;
  // A chunk of the sequence from row `first` on: its queries, keys (transposed) and values.
  auto queries = [&](uint32_t first) { return Operand{&query, first * D, d, D, 1}; };
  auto keys_t = [&](uint32_t first) { return Operand{&key, first * D, d, 1, D}; };
  auto values = [&](uint32_t first) { return Operand{&value, first * D, d, D, 1}; };
  auto scores = [&](uint32_t rows, uint32_t columns) { return Operand{&r.slot(kScores), 0, rows * columns, columns, 1}; };
  Operand ql{&r.slot(kQueryLandmarks), 0, md, d, 1}, kl_t{&r.slot(kKeyLandmarks), 0, md, 1, d};
  Operand a2{&r.slot(kAttention2), 0, mm, m, 1};
  r.product(m, m, d, kStatic, ql, kl_t, a2, 1, false);
  r.softmax(*a2.tensor, m, m, false);
  record_pseudo_inverse(r, recorder, kernels, H, m, static_cast<uint32_t>(iterations_));
  const uint32_t step = H * mm;
  Operand pinv{&r.slot(kPinvZ), static_cast<uint32_t>(iterations_) * step, mm, m, 1};
  // softmax(ql k^T)'s row statistics, then a chunk of its values at a time (a3_c).
  const auto sequence = chunks(rows_, chunk_);
  for (auto [first, length] : sequence) {
    r.product(m, length, d, kColumns, ql, keys_t(first), scores(m, length), 1, false, 0, first);
    r.softmax_stats(length, first, first == 0 ? kStartStats : kFoldStats);
  }
  auto attention3 = [&](uint32_t first, uint32_t length) {
    r.product(m, length, d, kColumns, ql, keys_t(first), scores(m, length), 1, false, 0, first);
    r.softmax_stats(length, first, kApplyStats);
  };
  if (output_ == Output::class_attention) {
    // Row 0 of a1 (the class token's), of a1 pinv, then of a1 pinv a3 a chunk at a time.
    Operand weights{&r.slot(kClassWeights), 0, m, m, 1};
    r.product(1, m, d, kStatic, queries(0), kl_t, scores(1, m), scale, false);
    r.softmax(r.slot(kScores), 1, m, false);
    r.product(1, m, m, kStatic, scores(1, m), pinv, weights, 1, false);
    for (auto [first, length] : sequence) {
      attention3(first, length);
      r.product(1, length, m, kColumns, weights, scores(m, length), Operand{&r.slot(kTokenAttention), first, S, S, 1}, 1,
                false, 0, first);
    }
    struct ClassPush {
      uint32_t patches_max, rows, heads;
    };
    recorder.dispatch_elements(kernel_for<ClassPush>(kernels, vk::kernel::nystrom_class_attention, *t.output, {kElementwiseGroup}),
                               {reads(r.slot(kTokenAttention)), r.reads_count(), writes(*t.output)},
                               ClassPush{S - 1, S, H}, S - 1, kElementwiseGroup);
    return;
  }
  Operand w{&r.slot(kValues), 0, md, d, 1}, y{&r.slot(kMixed), 0, md, d, 1};
  for (auto [first, length] : sequence) {
    attention3(first, length);
    r.product(m, d, length, kDepth, scores(m, length), values(first), w, 1, first > 0, 0, first);
  }
  r.product(m, d, m, kStatic, pinv, w, y, 1, false);
  // out = a1 y, a chunk of rows at a time (the class token's row alone where that is the output).
  const bool class_token = output_ == Output::class_token;
  const uint32_t out_rows = class_token ? 1 : S;
  for (auto [first, length] : class_token ? chunks(1, 1) : sequence) {
    r.product(length, m, d, kRows, queries(first), kl_t, scores(length, m), scale, false, 0, first);
    r.softmax(r.slot(kScores), length, m, true, first);
    r.product(length, d, m, kRows, scores(length, m), y, Operand{t.output, first * D, d, D, 1}, 1, false, 0, first);
  }
  struct ResidualPush {
    uint32_t rows, head_dim, width, kernel;
  };
  recorder.dispatch_elements(kernel_for<ResidualPush>(kernels, vk::kernel::nystrom_residual, *t.output, {kElementwiseGroup}),
                             {reads(value), reads(r.slot(kWeight)), r.reads_count(), updates(*t.output)},
                             ResidualPush{out_rows, d, D, static_cast<uint32_t>(kernel_)}, uint64_t{out_rows} * D,
                             kElementwiseGroup);
}

// The forward pass's products in reverse (the header's names): out = a1 y with a1's scores
// q kl^T a chunk of rows at a time, y = pinv w, the pseudo-inverse's iterations and its start,
// softmax(ql kl^T), w = a3 v with a3's scores ql k^T a chunk at a time, and the landmarks'
// means; then the residual convolution's share.
void NystromAttention::backward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const auto S = static_cast<uint32_t>(rows_), D = static_cast<uint32_t>(width_), d = static_cast<uint32_t>(head_dim_),
             m = static_cast<uint32_t>(landmarks_), H = static_cast<uint32_t>(heads_);
  Recording r(recorder, kernels, t, H, m);
  if (recompute_) record_projections(recorder, kernels, t, S, D);  // the forward's
  const Tensor &query = r.slot(kQ), &key = r.slot(kK), &value = r.slot(kV), &dquery = r.slot(kGradQ);
  // dk and dv take the buffers of q and v once those are read for the last time: q in a1's
  // chunks, v in a3's, each of its chunks before that chunk's gradient is written (the residual
  // convolution's weight, which reads v across chunks, takes its gradient first). Backward then
  // holds four [S, D] buffers rather than six: 206 MB fewer at 100,000 patches in fp16.
  const Tensor &dkey = query, &dvalue = value;
  const Tensor& dout = *t.output_grad;
  // With the class token's row alone, a1's share reaches the queries of that row only: the
  // other rows' start from zero, and the landmarks' share adds.
  const bool class_token = output_ == Output::class_token;
  if (class_token) recorder.fill(dquery.buffer(), 0);
  float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const uint32_t mm = m * m, md = m * d, step = H * mm;
  const auto iterations = static_cast<uint32_t>(iterations_);
  auto square = [&](Slot s, uint32_t offset = 0) { return Operand{&r.slot(s), offset, mm, m, 1}; };
  auto square_t = [&](Slot s, uint32_t offset = 0) { return Operand{&r.slot(s), offset, mm, 1, m}; };
  auto narrow = [&](Slot s) { return Operand{&r.slot(s), 0, md, d, 1}; };    // [h, m, d]
  auto narrow_t = [&](Slot s) { return Operand{&r.slot(s), 0, md, 1, d}; };  // its transpose [h, d, m]
  // A chunk of the sequence from row `first` on, of q, k, v or their gradients, and transposed.
  auto part = [&](const Tensor& x, uint32_t first) { return Operand{&x, first * D, d, D, 1}; };
  auto part_t = [&](const Tensor& x, uint32_t first) { return Operand{&x, first * D, d, 1, D}; };
  // A chunk's scores (or their gradients) [h, rows, columns], and transposed.
  auto chunk = [&](Slot s, uint32_t rows, uint32_t columns) { return Operand{&r.slot(s), 0, rows * columns, columns, 1}; };
  auto chunk_t = [&](Slot s, uint32_t rows, uint32_t columns) { return Operand{&r.slot(s), 0, rows * columns, 1, columns}; };
  Operand kl_t{&r.slot(kKeyLandmarks), 0, md, 1, d};
  const auto sequence = chunks(rows_, chunk_);

  // out = a1 y: a1's chunk recomputed; dy, then a1's scores' gradient to q and kl.
  const uint32_t out_rows = class_token ? 1 : S;
  for (auto [first, length] : class_token ? chunks(1, 1) : sequence) {
    r.product(length, m, d, kRows, part(query, first), kl_t, chunk(kScores, length, m), scale, false, 0, first);
    r.softmax(r.slot(kScores), length, m, true, first);
    Operand dout_chunk{&dout, first * D, d, D, 1};
    r.product(length, m, d, kRows, dout_chunk, narrow_t(kMixed), chunk(kGradScores, length, m), 1, false, 0, first);
    r.product(m, d, length, kDepth, chunk_t(kScores, length, m), dout_chunk, narrow(kGradMixed), 1, first > 0, 0, first);
    r.softmax_backward(r.slot(kScores), r.slot(kGradScores), length, m);
    r.product(m, d, length, kDepth, chunk_t(kGradScores, length, m), part(query, first), narrow(kGradKeyLandmarks), scale,
              first > 0, 0, first);
    r.product(length, d, m, kRows, chunk(kGradScores, length, m), narrow(kKeyLandmarks), part(dquery, first), scale,
              class_token, 0, first);
  }
  // y = pinv w, with the pseudo-inverse's iterates (computed again)
  if (recompute_) record_pseudo_inverse(r, recorder, kernels, H, m, static_cast<uint32_t>(iterations_));
  Operand pinv_t = square_t(kPinvZ, iterations * step);
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
  // the residual convolution's weight, from v whole before dv is written over it
  const auto kernel = static_cast<uint32_t>(kernel_);
  struct WeightPush {
    uint32_t head_dim, width, kernel, dout_rows;
  };
  recorder.dispatch(kernels.get<WeightPush>(vk::kernel::nystrom_residual_weight_backward),
                    {reads(dout), reads(value), r.reads_count(), updates(*t.grads[kWeight])},
                    WeightPush{d, D, kernel, out_rows}, H * kernel);
  // w = a3 v: a3's chunk recomputed; dv, then a3's scores' gradient to ql and k.
  Operand ql{&r.slot(kQueryLandmarks), 0, md, d, 1};
  for (auto [first, length] : sequence) {
    r.product(m, length, d, kColumns, ql, part_t(key, first), chunk(kScores, m, length), 1, false, 0, first);
    r.softmax_stats(length, first, kApplyStats);
    r.product(m, length, d, kColumns, narrow(kGradValues), part_t(value, first), chunk(kGradScores, m, length), 1, false, 0, first);
    r.product(length, d, m, kRows, chunk_t(kScores, m, length), narrow(kGradValues), part(dvalue, first), 1, false, 0, first);
    r.softmax_backward(r.slot(kScores), r.slot(kGradScores), m, length, d);
    r.product(m, d, length, kDepth, chunk(kGradScores, m, length), part(key, first), narrow(kGradQueryLandmarks), 1,
              first > 0, 0, first);
    r.product(length, d, m, kRows, chunk_t(kGradScores, m, length), narrow(kQueryLandmarks), part(dkey, first), 1, false,
              0, first);
  }
  // a2's scores ql kl^T
  r.product(m, d, m, kStatic, square(kGradAttention2), narrow(kKeyLandmarks), narrow(kGradQueryLandmarks), 1, true);
  r.product(m, d, m, kStatic, square_t(kGradAttention2), narrow(kQueryLandmarks), narrow(kGradKeyLandmarks), 1, true);
  struct LandmarkPush {
    uint32_t rows, heads, head_dim, landmarks, width;
    float scale;
  };
  recorder.dispatch_elements(
      kernel_for<LandmarkPush>(kernels, vk::kernel::nystrom_landmarks_backward, dquery, {kElementwiseGroup}),
      {reads(r.slot(kGradQueryLandmarks)), reads(r.slot(kGradKeyLandmarks)), r.reads_count(), updates(dquery), updates(dkey)},
      LandmarkPush{S, H, d, m, D, scale}, uint64_t{S} * 2 * D, kElementwiseGroup);
  // the residual convolution's share of dv
  struct ResidualPush {
    uint32_t rows, head_dim, width, kernel, dout_rows;
  };
  recorder.dispatch_elements(kernel_for<ResidualPush>(kernels, vk::kernel::nystrom_residual_backward, dvalue, {kElementwiseGroup}),
                             {reads(dout), reads(r.slot(kWeight)), r.reads_count(), updates(dvalue)},
                             ResidualPush{S, d, D, kernel, out_rows}, uint64_t{S} * D, kElementwiseGroup);
  record_projections_backward(recorder, kernels, t, S, D, {&dquery, &dkey, &dvalue});
}

}  // namespace tessera
