#include "compute/swin.h"

#include <algorithm>

#include "common/json_input.h"
#include "compute/ops/registry.h"

namespace tessera {

namespace {

// Limits of a description, far past every real Swin (Swin-L: embed_dim 192, depths 2/2/18/2,
// windows of 12 at 384 pixels), checked before anything is built.
constexpr int64_t kMaxSwinWidth = 4096, kMaxStages = 8, kMaxStageDepth = 64, kMaxImageSize = 4096, kMaxWindow = 64;
constexpr double kMaxSwinMlpRatio = 16;

// A per-stage list (depths, heads), taken out of the settings before LayerConfig reads the rest.
std::vector<int64_t> stage_integers(const LayerConfig& config, const char* field, const nlohmann::json* value,
                                    size_t stages, int64_t most) {
  if (!value) config.fail(field, "is required");
  if (!value->is_array() || value->empty() || value->size() > kMaxStages || (stages > 0 && value->size() != stages))
    config.fail(field, "must be an array of " + (stages > 0 ? std::to_string(stages) : "1 to " + std::to_string(kMaxStages)) +
                           " integers, one per stage");
  std::vector<int64_t> values;
  for (auto& item : *value) {
    if (!item.is_number_integer() || item.get<int64_t>() < 1 || item.get<int64_t>() > most)
      config.fail(field, "must hold integers from 1 to " + std::to_string(most) + ", got " + json_excerpt(*value));
    values.push_back(item.get<int64_t>());
  }
  return values;
}

}  // namespace

nlohmann::json swin_graph(nlohmann::json settings, const std::string& name) {
  for (const char* field : {"preprocessing", "source", "trident", "family"}) settings.erase(field);
  settings["name"] = name;
  settings["type"] = "swin";
  nlohmann::json stage_fields = nlohmann::json::object();
  for (const char* field : {"depths", "heads"})
    if (settings.contains(field)) {
      stage_fields[field] = settings[field];
      settings.erase(field);
    }
  LayerConfig config(settings);
  auto stage_field = [&](const char* field) { return stage_fields.contains(field) ? &stage_fields[field] : nullptr; };
  const int64_t image_size = config.integer("image_size", std::nullopt, 1, kMaxImageSize);
  const int64_t patch = config.integer("patch_size", 4, 1, kMaxImageSize);
  const int64_t width = config.integer("width", std::nullopt, 1, kMaxSwinWidth);
  const std::vector<int64_t> depths = stage_integers(config, "depths", stage_field("depths"), 0, kMaxStageDepth);
  const std::vector<int64_t> heads =
      stage_integers(config, "heads", stage_field("heads"), depths.size(), kMaxSwinWidth);
  const int64_t window = config.integer("window", 7, 1, kMaxWindow);
  const double mlp_ratio = config.number("mlp_ratio", 4.0);
  const bool qkv_bias = config.boolean("qkv_bias", true);
  const double eps = config.number("norm_eps", 1e-5), bn_eps = config.number("batch_norm_eps", 1e-5);
  config.refuse_unread();

  if (!(mlp_ratio > 0 && mlp_ratio <= kMaxSwinMlpRatio)) config.fail("mlp_ratio", "must be above 0 and at most 16");
  if (!(eps > 0 && eps <= 1)) config.fail("norm_eps", "must be above 0 and at most 1");
  if (!(bn_eps > 0 && bn_eps <= 1)) config.fail("batch_norm_eps", "must be above 0 and at most 1");
  // ConvStem: two stride-2 convolutions (CTransPath's ctran.py asserts patch_size 4, and embed_dim % 8).
  if (patch != 4) config.fail("patch_size", "must be 4 (CTransPath's ConvStem asserts it)");
  if (width % 8 != 0) config.fail("width", "must be a multiple of 8 (ConvStem's first width is width / 8)");
  if (image_size % patch != 0) config.fail("image_size", "must be a multiple of patch_size " + std::to_string(patch));
  const auto stages = static_cast<int64_t>(depths.size());
  // timm builds stage i at patch_grid // 2^i; PatchMerging asserts an even grid before each next stage.
  int64_t grid = image_size / patch;
  for (int64_t i = 0; i < stages; ++i) {
    const int64_t dim = width << i, stage_window = std::min(window, grid);
    if (dim % heads[static_cast<size_t>(i)] != 0)
      config.fail("heads", "stage " + std::to_string(i) + "'s " + std::to_string(heads[static_cast<size_t>(i)]) +
                               " heads do not divide its width " + std::to_string(dim));
    if (grid % stage_window != 0)
      config.fail("image_size", "gives stage " + std::to_string(i) + " a " + std::to_string(grid) + " x " +
                                    std::to_string(grid) + " grid, not a multiple of the window " +
                                    std::to_string(stage_window) + " (timm 0.5.4's Swin neither pads nor crops)");
    if (i + 1 < stages && grid % 2 != 0)
      config.fail("image_size", "gives stage " + std::to_string(i) + " an odd " + std::to_string(grid) +
                                    "-token grid, which PatchMerging cannot halve");
    if (i + 1 < stages) grid /= 2;
  }
  if ((width << (stages - 1)) * 4 > kMaxLayerInteger) config.fail("width", "is too wide for its stages");

  nlohmann::json layers = nlohmann::json::array();
  grid = image_size / patch;
  // ctran.py ConvStem: nn.Sequential(Conv2d, BatchNorm2d, ReLU, Conv2d, BatchNorm2d, ReLU, Conv2d).
  int64_t channels = width / 8;
  std::string input = "input";
  for (int l = 0; l < 2; ++l, channels *= 2) {
    const std::string base = "patch_embed.proj.";
    layers.push_back(layer_description(base + std::to_string(3 * l), "conv2d",
                                       {{"out_channels", channels}, {"kernel", 3}, {"stride", 2}, {"padding", 1}, {"bias", false}},
                                       {input}));
    layers.push_back(layer_description(base + std::to_string(3 * l + 1), "batch_norm2d", {{"eps", bn_eps}}));
    layers.push_back(layer_description(base + std::to_string(3 * l + 2), "relu"));
    input = base + std::to_string(3 * l + 2);
  }
  layers.push_back(layer_description("patch_embed.proj.6", "conv2d",
                                     {{"out_channels", width}, {"kernel", 1}, {"stride", 1}, {"padding", 0}}));
  // x.flatten(2).transpose(1, 2): [N, C, H, W] -> [N, H * W, C], vit_tokens without tokens or positions.
  layers.push_back(layer_description("patch_embed.flatten", "vit_tokens",
                                     {{"class_token", false}, {"register_tokens", 0}, {"position_embedding", "none"},
                                      {"grid_height", grid}, {"grid_width", grid}}));
  layers.push_back(layer_description("patch_embed.norm", "layer_norm", {{"eps", eps}}));
  std::string x = "patch_embed.norm";
  for (int64_t i = 0; i < stages; ++i) {
    const int64_t dim = width << i;
    const auto hidden = static_cast<int64_t>(static_cast<double>(dim) * mlp_ratio);
    // SwinTransformerBlock.__init__: a grid no larger than the window is one window, unshifted.
    const bool one_window = grid <= window;
    const int64_t stage_window = one_window ? grid : window;
    for (int64_t j = 0; j < depths[static_cast<size_t>(i)]; ++j) {
      const std::string prefix = "layers." + std::to_string(i) + ".blocks." + std::to_string(j) + ".";
      const int64_t shift = (one_window || j % 2 == 0) ? 0 : window / 2;
      auto branch = [&](const std::string& norm, std::vector<nlohmann::json> body, const std::string& sum) {
        layers.push_back(layer_description(prefix + norm, "layer_norm", {{"eps", eps}}, {x}));
        for (auto& l : body) layers.push_back(l);
        layers.push_back(layer_description(prefix + sum, "add", {}, {x, layers.back()["name"].get<std::string>()}));
        x = prefix + sum;
      };
      branch("norm1",
             {layer_description(prefix + "attn.qkv", "linear", {{"out_features", 3 * dim}, {"bias", qkv_bias}}),
              layer_description(prefix + "attn", "window_attention",
                                {{"heads", heads[static_cast<size_t>(i)]}, {"window", stage_window}, {"shift", shift},
                                 {"grid_height", grid}, {"grid_width", grid}}),
              layer_description(prefix + "attn.proj", "linear", {{"out_features", dim}})},
             "residual1");
      branch("norm2",
             {layer_description(prefix + "mlp.fc1", "linear", {{"out_features", hidden}}),
              layer_description(prefix + "mlp.act", "gelu"),
              layer_description(prefix + "mlp.fc2", "linear", {{"out_features", dim}})},
             "residual2");
    }
    if (i + 1 < stages) {
      const std::string prefix = "layers." + std::to_string(i) + ".downsample.";
      layers.push_back(layer_description(prefix + "merge", "patch_merge", {{"grid_height", grid}, {"grid_width", grid}}, {x}));
      layers.push_back(layer_description(prefix + "norm", "layer_norm", {{"eps", eps}}));
      layers.push_back(layer_description(prefix + "reduction", "linear", {{"out_features", 2 * dim}, {"bias", false}}));
      x = prefix + "reduction";
      grid /= 2;
    }
  }
  layers.push_back(layer_description("norm", "layer_norm", {{"eps", eps}}, {x}));
  layers.push_back(layer_description("pool", "token_pool", {{"output", "patch_mean"}, {"prefix_tokens", 0}}));
  return {{"name", name}, {"layers", layers}};
}

}  // namespace tessera
