#include "compute/ops/registry.h"

#include <algorithm>
#include <map>

#include "common/json_input.h"

#include "compute/ops/activation.h"
#include "compute/ops/add.h"
#include "compute/ops/attention_gate.h"
#include "compute/ops/attention.h"
#include "compute/ops/attention_pool.h"
#include "compute/ops/attentional_pool.h"
#include "compute/ops/avg_pool2d.h"
#include "compute/ops/batch_norm2d.h"
#include "compute/ops/clam_instance_loss.h"
#include "compute/ops/class_linear.h"
#include "compute/ops/conv2d.h"
#include "compute/ops/critical_instance_scores.h"
#include "compute/ops/dropout.h"
#include "compute/ops/flatten.h"
#include "compute/ops/global_avg_pool.h"
#include "compute/ops/input_normalize.h"
#include "compute/ops/instance_max.h"
#include "compute/ops/instance_mean.h"
#include "compute/ops/layer_norm.h"
#include "compute/ops/layer_scale.h"
#include "compute/ops/linear.h"
#include "compute/ops/max_pool2d.h"
#include "compute/ops/nystrom_attention.h"
#include "compute/ops/patch_merge.h"
#include "compute/ops/ppeg.h"
#include "compute/ops/relu.h"
#include "compute/ops/softmax_cross_entropy.h"
#include "compute/ops/tanh.h"
#include "compute/ops/transmil_sequence.h"
#include "compute/ops/vit_tokens.h"
#include "compute/ops/window_attention.h"

namespace tessera {

namespace {
// Names appear in messages, checkpoints and feature files: "blocks.39.mlp.fc1" is 17 bytes.
constexpr size_t kMaxNameBytes = 256;
}  // namespace

LayerConfig::LayerConfig(const nlohmann::json& layer) : layer_(layer) {
  if (!layer.is_object()) throw ModelError("model: every layer must be a JSON object, got " + json_excerpt(layer));
  auto name = layer.find("name");
  if (name == layer.end() || !name->is_string() || name->get<std::string>().empty())
    throw ModelError("model: layer " + json_excerpt(layer) + ": field 'name' must be a non-empty string");
  name_ = name->get<std::string>();
  if (name_.size() > kMaxNameBytes)
    throw ModelError("model: layer '" + quoted_excerpt(name_) + "': field 'name' is " + std::to_string(name_.size()) +
                     " bytes long (at most " + std::to_string(kMaxNameBytes) + ")");
  auto type = layer.find("type");
  if (type == layer.end() || !type->is_string()) fail("type", "must be a string");
  type_ = type->get<std::string>();
}

void LayerConfig::fail(const std::string& field, const std::string& problem) const {
  throw ModelError("model: layer '" + quoted_excerpt(name_) + "': field '" + quoted_excerpt(field) + "' " + problem);
}

const nlohmann::json* LayerConfig::find(const char* field) const {
  read_.insert(field);
  auto it = layer_.find(field);
  return it == layer_.end() ? nullptr : &*it;
}

int64_t LayerConfig::integer(const char* field, std::optional<int64_t> fallback, int64_t minimum,
                             int64_t maximum) const {
  const nlohmann::json* value = find(field);
  if (!value) {
    if (!fallback) fail(field, "is required");
    return *fallback;
  }
  // A number_unsigned past 2^63 reads as a negative int64: refused as below the minimum.
  if (!value->is_number_integer() || value->get<int64_t>() < minimum || value->get<int64_t>() > maximum)
    fail(field, "must be an integer from " + std::to_string(minimum) + " to " + std::to_string(maximum) + ", got " +
                    json_excerpt(*value));
  return value->get<int64_t>();
}

double LayerConfig::number(const char* field, std::optional<double> fallback) const {
  const nlohmann::json* value = find(field);
  if (!value) {
    if (!fallback) fail(field, "is required");
    return *fallback;
  }
  if (!value->is_number()) fail(field, "must be a number, got " + json_excerpt(*value));
  return value->get<double>();
}

std::vector<double> LayerConfig::numbers(const char* field, std::vector<double> fallback) const {
  const nlohmann::json* value = find(field);
  if (!value) return fallback;
  if (!value->is_array() || value->size() != fallback.size() ||
      !std::all_of(value->begin(), value->end(), [](const nlohmann::json& v) { return v.is_number(); }))
    fail(field, "must be an array of " + std::to_string(fallback.size()) + " numbers, got " + json_excerpt(*value));
  return value->get<std::vector<double>>();
}

bool LayerConfig::boolean(const char* field, std::optional<bool> fallback) const {
  const nlohmann::json* value = find(field);
  if (!value) {
    if (!fallback) fail(field, "is required");
    return *fallback;
  }
  if (!value->is_boolean()) fail(field, "must be true or false, got " + json_excerpt(*value));
  return value->get<bool>();
}

std::string LayerConfig::choice(const char* field, const std::string& fallback,
                                const std::vector<std::string>& allowed) const {
  const nlohmann::json* value = find(field);
  if (!value) return fallback;
  std::string names;
  for (auto& name : allowed) names += (names.empty() ? "'" : ", '") + name + "'";
  if (!value->is_string() || std::find(allowed.begin(), allowed.end(), value->get<std::string>()) == allowed.end())
    fail(field, "must be one of " + names + ", got " + json_excerpt(*value));
  return value->get<std::string>();
}

std::unique_ptr<Op> make_op(const LayerConfig& layer) {
  using Factory = std::unique_ptr<Op> (*)(const LayerConfig&);
  static const std::map<std::string, Factory> factories = {
      {"relu", make_relu},
      {"conv2d", make_conv2d},
      {"linear", make_linear},
      {"max_pool2d", make_max_pool2d},
      {"flatten", make_flatten},
      {"add", make_add},
      {"dropout", make_dropout},
      {"softmax_cross_entropy", make_softmax_cross_entropy},
      {"batch_norm2d", make_batch_norm2d},
      {"avg_pool2d", make_avg_pool2d},
      {"global_avg_pool", make_global_avg_pool},
      {"instance_mean", make_instance_mean},
      {"instance_max", make_instance_max},
      {"attention_gate", make_attention_gate},
      {"attention_pool", make_attention_pool},
      {"critical_instance_scores", make_critical_instance_scores},
      {"class_linear", make_class_linear},
      {"clam_instance_loss", make_clam_instance_loss},
      {"tanh", make_tanh},
      {"input_normalize", make_input_normalize},
      // TransMIL's sequence, its attention and its position encoding (bags of any size, from the count)
      {"transmil_sequence", make_transmil_sequence},
      {"nystrom_attention", make_nystrom_attention},
      {"ppeg", make_ppeg},
      // Transformers (inference only; token_pool's class token also trains)
      {"layer_norm", make_layer_norm},
      {"gelu", make_gelu},
      {"silu", make_silu},
      {"swiglu", make_swiglu},
      {"attention", make_attention},
      {"layer_scale", make_layer_scale},
      {"vit_tokens", make_vit_tokens},
      {"token_pool", make_token_pool},
      {"attentional_pool", make_attentional_pool},
      {"window_attention", make_window_attention},
      {"patch_merge", make_patch_merge},
  };
  auto it = factories.find(layer.type());
  if (it == factories.end()) {
    std::string known;
    for (auto& [type, factory] : factories) known += (known.empty() ? "" : ", ") + type;
    layer.fail("type", "'" + quoted_excerpt(layer.type()) + "' is not an op (known: " + known + ")");
  }
  auto op = it->second(layer);
  layer.refuse_unread();
  return op;
}

nlohmann::json layer_description(const std::string& name, const std::string& type, nlohmann::json fields,
                                 std::vector<std::string> inputs) {
  fields["name"] = name;
  fields["type"] = type;
  if (!inputs.empty()) fields["inputs"] = inputs;
  return fields;
}

void LayerConfig::refuse_unread() const {
  // A field no op reads ("dilation", "ceil_mode") would make the model differ silently from
  // the one it mirrors.
  for (auto& [field, value] : layer_.items())
    if (field != "name" && field != "type" && field != "inputs" && !read_.count(field))
      fail(field, "is not a field of " + type_ + " (tessera does not implement it)");
}

}  // namespace tessera
