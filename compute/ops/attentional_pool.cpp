#include "compute/ops/attentional_pool.h"

#include <cmath>

#include "compute/ops/gemm.h"
#include "compute/ops/layer_norm.h"

namespace tessera {

namespace {
struct ScoresPush {
  uint32_t count, tokens, queries, heads, head_dim;
  float scale;
};
struct AttendPush {
  uint32_t count, tokens, queries, heads, head_dim;
};
// Parameters, then scratch, in tensors()'s order.
enum Slot { query, ln_k_weight, ln_k_bias, ln_q_weight, ln_q_bias, to_q, to_kv, to_out,
            keys_normed, query_normed, query_projected, keys_values, scores, attended };
}  // namespace

std::unique_ptr<Op> make_attentional_pool(const LayerConfig& layer) {
  const int64_t width = layer.integer("width", std::nullopt, 1, kMaxLayerInteger);
  const int64_t heads = layer.integer("heads", std::nullopt, 1, width);
  if (width % heads != 0) layer.fail("heads", "must divide width " + std::to_string(width));
  const int64_t queries = layer.integer("queries", 1, 1, 4096);
  const double eps = layer.number("eps", 1e-5);
  if (!(eps > 0 && eps <= 1)) layer.fail("eps", "must be above 0 and at most 1");
  return std::make_unique<AttentionalPool>(width, heads, queries, static_cast<float>(eps));
}

Shape AttentionalPool::infer(const std::vector<Shape>& inputs) {
  if (inputs.size() != 1 || inputs[0].size() != 3 || inputs[0][1] < 1 || inputs[0][2] < 1)
    throw ShapeError("attentional_pool takes tokens [batch, tokens, features]");
  batch_ = inputs[0][0];
  tokens_ = inputs[0][1];
  context_ = inputs[0][2];
  if (context_ > kMaxGemmDimension || width_ > kMaxGemmDimension)
    throw ShapeError("attentional_pool: at most " + std::to_string(kMaxGemmDimension) + " features");
  if (queries_ == 1) return {batch_, width_};
  return {batch_, queries_, width_};
}

std::vector<TensorSpec> AttentionalPool::tensors() const {
  auto linear = [](const char* name, int64_t out, int64_t in) {
    return TensorSpec{name, {out, in}, TensorRole::parameter, DType::f32,
                      {Init::uniform, 1.0f / std::sqrt(static_cast<float>(in))}};
  };
  auto scratch = [](const char* name, Shape shape) { return TensorSpec{name, std::move(shape), TensorRole::saved}; };
  return {{"query", {queries_, width_}, TensorRole::parameter, DType::f32, {Init::normal, 1.0f}},
          {"ln_k.weight", {context_}, TensorRole::parameter, DType::f32, {Init::ones}},
          {"ln_k.bias", {context_}, TensorRole::parameter, DType::f32, {Init::zeros}},
          {"ln_q.weight", {width_}, TensorRole::parameter, DType::f32, {Init::ones}},
          {"ln_q.bias", {width_}, TensorRole::parameter, DType::f32, {Init::zeros}},
          linear("to_q.weight", width_, width_),
          linear("to_kv.weight", 2 * width_, context_),
          linear("to_out.weight", width_, width_),
          scratch("keys_normed", {batch_, tokens_, context_}),
          scratch("query_normed", {queries_, width_}),
          scratch("query_projected", {queries_, width_}),
          scratch("keys_values", {batch_, tokens_, 2 * width_}),
          scratch("scores", {batch_, heads_, queries_, tokens_}),
          scratch("attended", {batch_, queries_, width_})};
}

double AttentionalPool::forward_flops() const {
  // to_kv over every token, the scores and the weighted sum, to_q and to_out.
  auto n = static_cast<double>(batch_), t = static_cast<double>(tokens_), q = static_cast<double>(queries_),
       d = static_cast<double>(width_), c = static_cast<double>(context_);
  return 2 * n * t * c * 2 * d + 4 * n * q * t * d + 2 * q * d * d + 2 * n * q * d * d;
}

void AttentionalPool::forward(vk::Recorder& recorder, vk::Kernels& kernels, const OpTensors& t) {
  const auto& s = t.tensors;
  const auto rows = static_cast<uint32_t>(batch_ * tokens_), width = static_cast<uint32_t>(width_),
             context = static_cast<uint32_t>(context_), queries = static_cast<uint32_t>(queries_);
  const uint32_t head_dim = width / static_cast<uint32_t>(heads_);
  record_layer_norm(recorder, kernels, *t.inputs[0], *s[ln_k_weight], *s[ln_k_bias], *s[keys_normed], rows, context_,
                    eps_);
  record_layer_norm(recorder, kernels, *s[query], *s[ln_q_weight], *s[ln_q_bias], *s[query_normed], queries_, width_,
                    eps_);
  // y^T [out, rows] = weight [out, in] x^T [in, rows], as Linear.
  record_gemm(recorder, kernels, width, queries, width, {s[to_q], width, 1}, {s[query_normed], 1, width},
              {s[query_projected], 1, width}, false);
  record_gemm(recorder, kernels, 2 * width, rows, context, {s[to_kv], context, 1}, {s[keys_normed], 1, context},
              {s[keys_values], 1, 2 * width}, false);
  const auto score_count = static_cast<uint32_t>(s[scores]->count());
  recorder.dispatch_elements(
      kernels.get<ScoresPush>(vk::kernel::attentional_pool_scores, {kElementwiseGroup}),
      {reads(*s[query_projected]), reads(*s[keys_values]), writes(*s[scores])},
      ScoresPush{score_count, static_cast<uint32_t>(tokens_), queries, static_cast<uint32_t>(heads_), head_dim,
                 static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)))},
      score_count, kElementwiseGroup);
  const auto attended_count = static_cast<uint32_t>(s[attended]->count());
  recorder.dispatch_elements(kernels.get<AttendPush>(vk::kernel::attentional_pool_attend, {kElementwiseGroup}),
                             {reads(*s[scores]), reads(*s[keys_values]), writes(*s[attended])},
                             AttendPush{attended_count, static_cast<uint32_t>(tokens_), queries,
                                        static_cast<uint32_t>(heads_), head_dim},
                             attended_count, kElementwiseGroup);
  const auto outputs = static_cast<uint32_t>(batch_ * queries_);
  record_gemm(recorder, kernels, width, outputs, width, {s[to_out], width, 1}, {s[attended], 1, width},
              {t.output, 1, width}, false);
}

}  // namespace tessera
