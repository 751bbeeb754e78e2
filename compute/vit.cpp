#include "compute/vit.h"

#include <cmath>
#include <optional>
#include <regex>

#include "common/json_input.h"

#include "compute/ops/registry.h"
#include "compute/swin.h"

namespace tessera {

// compute/vit_presets.json, embedded by compute/CMakeLists.txt.
extern const char* const kVitPresetsJson;

namespace {

// Limits of a description, far past every real ViT (ViT-22B: width 6144, depth 48, mlp ratio 4;
// UNI2-h at 224 px: 265 tokens), checked before anything is built so that a description cannot
// make a graph, a plan or a run of absurd size.
constexpr int64_t kMaxVitWidth = 16384, kMaxDepth = 256;
constexpr double kMaxVitMlpRatio = 16;
// Tokens of an image: attention's cost grows with their square; 65536 is a 4096-pixel image in
// 16-pixel patches.
constexpr int64_t kMaxTokens = 65536;
constexpr double kMaxLayerScale = 1000;

const nlohmann::json& presets() {
  static const nlohmann::json parsed = nlohmann::json::parse(kVitPresetsJson);
  return parsed;
}

}  // namespace

std::optional<std::string> vit_preset_name(const std::string& name) {
  if (presets().contains(name)) return name;
  for (auto& [preset, settings] : presets().items())
    if (settings.value("trident", "") == name) return preset;
  return std::nullopt;
}

std::string vit_preset_list() {
  std::string list;
  for (auto& [name, settings] : presets().items()) {
    list += (list.empty() ? "" : ", ") + name;
    if (std::string trident = settings.value("trident", ""); !trident.empty() && trident != name)
      list += " (" + trident + ")";
  }
  return list;
}

bool is_vit_description(const nlohmann::json& description) {
  if (!description.is_object()) return false;
  if (auto family = description.find("family"); family != description.end() && (*family == "vit" || *family == "swin"))
    return true;
  auto preset = description.find("preset");
  return preset != description.end() && preset->is_string() && vit_preset_name(preset->get<std::string>());
}

nlohmann::json vit_settings(const nlohmann::json& description) {
  nlohmann::json settings = nlohmann::json::object();
  if (auto preset = description.find("preset"); preset != description.end()) {
    std::optional<std::string> name = preset->is_string() ? vit_preset_name(preset->get<std::string>()) : std::nullopt;
    if (!name) throw ModelError("model: preset " + json_excerpt(*preset) + " is not a ViT preset");
    settings = presets()[*name];
  }
  for (auto& [field, value] : description.items())
    if (field != "preset" && field != "family") settings[field] = value;
  return settings;
}

nlohmann::json vit_graph(const nlohmann::json& description) {
  // The graph's name: the description's, else the preset's (TRIDENT's name for it is tessera's).
  std::string name = "vit";
  for (const char* field : {"preset", "name"})
    if (auto it = description.find(field); it != description.end() && it->is_string()) name = it->get<std::string>();
  nlohmann::json settings = vit_settings(description);
  if (!description.contains("name") && description.contains("preset")) name = *vit_preset_name(name);
  // A Swin (CTransPath): by its preset's family or the description's.
  auto is_swin = [](const nlohmann::json& fields) { return fields.contains("family") && fields["family"] == "swin"; };
  if (is_swin(settings) || is_swin(description))
    return swin_graph(settings, name);
  for (const char* field : {"preprocessing", "source", "trident"})  // for the encoders' users, not the graph
    settings.erase(field);
  if (settings.contains("layer_scale") && settings["layer_scale"].is_null())
    settings.erase("layer_scale");  // a preset's, removed
  settings["name"] = name;
  settings["type"] = "vit";
  LayerConfig config(settings);

  const int64_t image_size = config.integer("image_size", std::nullopt, 1),
                patch = config.integer("patch_size", std::nullopt, 1);
  const int64_t width = config.integer("width", std::nullopt, 1, kMaxVitWidth),
                depth = config.integer("depth", std::nullopt, 1, kMaxDepth);
  const int64_t heads = config.integer("heads", std::nullopt, 1, width);
  const std::string mlp = config.choice("mlp", "gelu", {"gelu", "swiglu"});
  const double mlp_ratio = config.number("mlp_ratio", 4.0);
  const bool class_token = config.boolean("class_token", true);
  const int64_t registers = config.integer("register_tokens", 0);
  const bool layer_scale = config.json().contains("layer_scale");
  const double layer_scale_init = config.number("layer_scale", 1e-5);
  const std::string position =
      config.choice("position_embedding", "tokens", {"tokens", "patches", "class_and_patches", "none"});
  // How a position grid learned at another size is resampled: timm's antialiased bicubic, the
  // plain bicubic of Hugging Face's Dinov2 (Midnight), or DINO's by scale factor (CONCH v1.5).
  const std::string position_resample =
      config.choice("position_resample", "timm", {"timm", "bicubic", "bicubic_by_scale_factor"});
  const bool qkv_bias = config.boolean("qkv_bias", true);
  const double eps = config.number("norm_eps", 1e-6);
  const std::string final_norm = config.choice("final_norm", "tokens", {"tokens", "pooled", "none"});
  const std::string output = config.choice(
      "output", "class_token", {"class_token", "class_token_and_patch_mean", "patch_mean", "attentional_pool"});
  // CONCH v1.5's attn_pool_contrast and ln_contrast (output "attentional_pool").
  const bool attentional = output == "attentional_pool";
  const int64_t pool_width = attentional ? config.integer("pool_width", std::nullopt, 1, kMaxVitWidth) : 0;
  const int64_t pool_heads = attentional ? config.integer("pool_heads", std::nullopt, 1, kMaxVitWidth) : 0;
  const double pool_eps = attentional ? config.number("pool_norm_eps", 1e-5) : 0;
  const int64_t classes = config.integer("classes", 0);
  config.refuse_unread();

  // timm's Block: hidden_features = int(dim * mlp_ratio); the packed SwiGLU's fc1 gives both halves.
  if (!(mlp_ratio > 0 && mlp_ratio <= kMaxVitMlpRatio))
    config.fail("mlp_ratio", "must be above 0 and at most " + std::to_string(static_cast<int>(kMaxVitMlpRatio)));
  const auto hidden = static_cast<int64_t>(static_cast<double>(width) * mlp_ratio);
  if (hidden > kMaxLayerInteger)
    config.fail("mlp_ratio", "gives " + std::to_string(hidden) + " hidden features (at most " +
                                 std::to_string(kMaxLayerInteger) + ")");
  if (patch > image_size) config.fail("patch_size", "must be at most image_size " + std::to_string(image_size));
  if (image_size % patch != 0) config.fail("image_size", "must be a multiple of patch_size " + std::to_string(patch));
  const int64_t grid = image_size / patch, tokens = grid * grid + (class_token ? 1 : 0) + registers;
  if (tokens > kMaxTokens)
    config.fail(registers > grid * grid ? "register_tokens" : "image_size", "gives " + std::to_string(tokens) + " tokens ((image_size / patch_size)^2 " +
                                  std::to_string(grid) + "^2, the class token and registers; at most " +
                                  std::to_string(kMaxTokens) + ")");
  if (!(std::abs(layer_scale_init) <= kMaxLayerScale))
    config.fail("layer_scale", "must be from -1000 to 1000 (an initial value: real ones are 1e-5 to 1)");
  if (!(eps > 0 && eps <= 1)) config.fail("norm_eps", "must be above 0 and at most 1");
  if (width % heads != 0) config.fail("heads", "must divide width " + std::to_string(width));
  if (hidden < 1 || (mlp == "swiglu" && hidden % 2 != 0))
    config.fail("mlp_ratio", "gives " + std::to_string(hidden) + " hidden features" +
                                 (mlp == "swiglu" ? " (the packed SwiGLU needs an even number)" : ""));
  if (output != "patch_mean" && !attentional && !class_token)
    config.fail("output", "'" + output + "' needs class_token");
  if (attentional && pool_width % pool_heads != 0)
    config.fail("pool_heads", "must divide pool_width " + std::to_string(pool_width));
  if (attentional && !(pool_eps > 0 && pool_eps <= 1)) config.fail("pool_norm_eps", "must be above 0 and at most 1");
  if (attentional && final_norm == "pooled")
    config.fail("final_norm", "'pooled' is timm's fc_norm; the attentional pool's own norm is ln_contrast");
  if (final_norm == "pooled" && output == "class_token_and_patch_mean")
    config.fail("final_norm", "'pooled' normalises one token's width, not the joined output");

  nlohmann::json layers = nlohmann::json::array();
  layers.push_back(layer_description("patch_embed.proj", "conv2d",
                                     {{"out_channels", width}, {"kernel", patch}, {"stride", patch}, {"padding", 0}},
                                     {"input"}));
  layers.push_back(layer_description("tokens", "vit_tokens",
                                     {{"class_token", class_token},
                                      {"register_tokens", registers},
                                      {"position_embedding", position},
                                      {"position_resample", position_resample},
                                      {"grid_height", image_size / patch},
                                      {"grid_width", image_size / patch}}));
  std::string x = "tokens";
  // A block's last layer is its output, so that "blocks.3" names it (Network::layer).
  for (int64_t b = 0; b < depth; ++b) {
    std::string prefix = "blocks." + std::to_string(b) + ".";
    auto branch = [&](const std::string& norm, std::vector<nlohmann::json> body, const std::string& scale,
                      const std::string& sum) {
      layers.push_back(layer_description(prefix + norm, "layer_norm", {{"eps", eps}}, {x}));
      for (auto& l : body) layers.push_back(l);
      if (layer_scale) layers.push_back(layer_description(prefix + scale, "layer_scale", {{"init", layer_scale_init}}));
      layers.push_back(layer_description(prefix + sum, "add", {}, {x, layers.back()["name"].get<std::string>()}));
      x = prefix + sum;
    };
    branch("norm1",
           {layer_description(prefix + "attn.qkv", "linear", {{"out_features", 3 * width}, {"bias", qkv_bias}}),
            layer_description(prefix + "attn.attend", "attention", {{"heads", heads}}),
            layer_description(prefix + "attn.proj", "linear", {{"out_features", width}})},
           "ls1", "residual1");
    branch("norm2",
           {layer_description(prefix + "mlp.fc1", "linear", {{"out_features", hidden}}),
            mlp == "gelu" ? layer_description(prefix + "mlp.act", "gelu")
                          : layer_description(prefix + "mlp.gate", "swiglu"),
            layer_description(prefix + "mlp.fc2", "linear", {{"out_features", width}})},
           "ls2", "residual2");
  }
  if (final_norm == "tokens") layers.push_back(layer_description("norm", "layer_norm", {{"eps", eps}}));
  int64_t prefix_tokens = (class_token ? 1 : 0) + registers;
  if (attentional) {
    // One learned query over every token, the class token's too (CONCHVisionTower.forward).
    layers.push_back(
        layer_description("attn_pool_contrast", "attentional_pool",
                          {{"width", pool_width}, {"heads", pool_heads}, {"queries", 1}, {"eps", pool_eps}}));
    layers.push_back(layer_description("ln_contrast", "layer_norm", {{"eps", pool_eps}}));
  } else {
    layers.push_back(layer_description("pool", "token_pool", {{"output", output}, {"prefix_tokens", prefix_tokens}}));
  }
  if (final_norm == "pooled") layers.push_back(layer_description("fc_norm", "layer_norm", {{"eps", eps}}));
  if (classes > 0) layers.push_back(layer_description("head", "linear", {{"out_features", classes}}));
  return {{"name", name}, {"layers", layers}};
}

ParameterPiece timm_parameter_piece(const std::string& name) {
  static const std::vector<std::pair<std::regex, std::string>> renames = {
      // CONCH v1.5's CONCHVisionTower: a timm ViT as its trunk (attn_pool_contrast and ln_contrast
      // are the graph's own names).
      {std::regex(R"(^trunk\.)"), ""},
      // torchvision's VisionTransformer.
      {std::regex(R"(^conv_proj\.)"), "patch_embed.proj."},
      {std::regex(R"(^class_token$)"), "cls_token"},
      {std::regex(R"(^encoder\.pos_embedding$)"), "pos_embed"},
      {std::regex(R"(^encoder\.ln\.)"), "norm."},
      {std::regex(R"(^heads\.head\.)"), "head."},
      {std::regex(R"(^encoder\.layers\.encoder_layer_(\d+)\.ln_1\.)"), "blocks.$1.norm1."},
      {std::regex(R"(^encoder\.layers\.encoder_layer_(\d+)\.ln_2\.)"), "blocks.$1.norm2."},
      {std::regex(R"(^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.in_proj_(weight|bias)$)"),
       "blocks.$1.attn.qkv.$2"},
      {std::regex(R"(^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.out_proj\.)"), "blocks.$1.attn.proj."},
      // torchvision 0.14 numbers its MLP's layers; older releases named them linear_1 and linear_2.
      {std::regex(R"(^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(0|linear_1)\.)"), "blocks.$1.mlp.fc1."},
      {std::regex(R"(^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(3|linear_2)\.)"), "blocks.$1.mlp.fc2."},
      // Hugging Face transformers' Dinov2Model (models/dinov2/modeling_dinov2.py) and
      // Dinov2WithRegistersModel: Phikon-v2, Midnight, Hibou.
      {std::regex(R"(^embeddings\.cls_token$)"), "cls_token"},
      {std::regex(R"(^embeddings\.register_tokens$)"), "reg_token"},
      {std::regex(R"(^embeddings\.position_embeddings$)"), "pos_embed"},
      {std::regex(R"(^embeddings\.patch_embeddings\.projection\.)"), "patch_embed.proj."},
      {std::regex(R"(^encoder\.layer\.(\d+)\.norm(1|2)\.)"), "blocks.$1.norm$2."},
      {std::regex(R"(^encoder\.layer\.(\d+)\.attention\.output\.dense\.)"), "blocks.$1.attn.proj."},
      {std::regex(R"(^encoder\.layer\.(\d+)\.layer_scale(1|2)\.lambda1$)"), "blocks.$1.ls$2.gamma"},
      {std::regex(R"(^encoder\.layer\.(\d+)\.mlp\.(fc1|weights_in)\.)"), "blocks.$1.mlp.fc1."},
      {std::regex(R"(^encoder\.layer\.(\d+)\.mlp\.(fc2|weights_out)\.)"), "blocks.$1.mlp.fc2."},
      {std::regex(R"(^layernorm\.)"), "norm."},
  };
  // Hugging Face keeps query, key and value apart; timm's qkv stacks them in that order.
  static const std::regex hf_attention(R"(^encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$)");
  // Dinov2's mask token replaces masked patches in pre-training only; buffers a module derives from
  // its shape (Swin's relative_position_index and attn_mask, which TRIDENT drops from CTransPath's
  // checkpoint too, and BatchNorm's num_batches_tracked) are never read.
  static const std::regex derived(R"((^|\.)(relative_position_index|attn_mask|num_batches_tracked)$)");
  if (name == "embeddings.mask_token" || std::regex_search(name, derived)) return {};
  if (std::smatch match; std::regex_match(name, match, hf_attention)) {
    int piece = match[2] == "query" ? 0 : match[2] == "key" ? 1 : 2;
    return {"blocks." + match[1].str() + ".attn.qkv." + match[3].str(), piece, 3};
  }
  for (auto& [pattern, replacement] : renames)
    if (std::regex_search(name, pattern)) return {std::regex_replace(name, pattern, replacement)};
  return {name};
}

}  // namespace tessera
