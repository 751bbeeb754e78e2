// The `vit` model family (compute/vit.h): each preset is the architecture its model card names
// (parameter counts as timm's and torchvision's models have them, timm's names, the feature width),
// descriptions are checked field by field, torchvision's names map to timm's, and a ViT refuses
// to train. Outputs against PyTorch: tests/test_vit_timm.py and tests/test_vit_b16_torch.py.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "compute/network.h"
#include "compute/ops/registry.h"
#include "compute/vit.h"

namespace tessera {
namespace {

struct Parameters {
  int64_t count = 0;
  std::set<std::string> names;
};

Parameters parameters(const Network& network) {
  Parameters p;
  for (auto& layer : network.layers())
    for (auto& spec : layer.specs)
      if (spec.role == TensorRole::parameter) {
        p.count += element_count(spec.shape);
        p.names.insert(tensor_name(layer.name, spec));
      }
  return p;
}

// Counts of timm's models as the model cards build them (num_classes=0), and torchvision's
// vit_b_16 with its 1000-class head (torchvision documents 86,567,656). timm's tables give
// 21.67M for vit_small_patch16_224 and _patch8_224 and 304.37M for vit_large_patch14_reg4_dinov2
// (kaiko's ViT-S and ViT-L/14), 86.58M for vit_base_patch8_224 with its 1000-class head
// (85,807,872 + 769,000); H0-mini's paper gives 86M for its ViT-B/14, Virchow's 632M.
TEST(Vit, PresetsAreTheModelCardsArchitectures) {
  struct Expected {
    const char* preset;
    int64_t parameters, features;
  };
  for (auto [preset, count, features] :
       {Expected{"uni", 303350784, 1024}, Expected{"uni2-h", 681394176, 1536}, Expected{"virchow2", 631239424, 2560},
        Expected{"h-optimus-0", 1134774272, 1536}, Expected{"prov-gigapath", 1134953984, 1536},
        Expected{"vit-b16", 85798656, 768}, Expected{"h-optimus-1", 1134774272, 1536},
        Expected{"h0-mini", 85739520, 1536}, Expected{"kaiko-vits8", 21670272, 384},
        Expected{"kaiko-vits16", 21665664, 384}, Expected{"kaiko-vitb8", 85807872, 768},
        Expected{"kaiko-vitb16", 85798656, 768}, Expected{"kaiko-vitl14", 304370688, 1024},
        Expected{"lunit-vits8", 21670272, 384}, Expected{"virchow", 631229184, 2560}}) {
    SCOPED_TRACE(preset);
    Network network(load_model_description(preset, 2), Shape{2, 3, 224, 224}, false);
    Parameters p = parameters(network);
    EXPECT_EQ(p.count, count);
    EXPECT_EQ(network.output_shape(), (Shape{2, features}));
    for (const char* name : {"patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.0.attn.qkv.weight",
                             "blocks.0.mlp.fc1.weight", "norm.weight"})
      EXPECT_TRUE(p.names.count(name)) << name;
  }
  Network head(nlohmann::json{{"preset", "vit-b16"}, {"classes", 1000}}, Shape{1, 3, 224, 224}, false);
  EXPECT_EQ(parameters(head).count, 86567656);
  EXPECT_EQ(head.output_shape(), (Shape{1, 1000}));
}

TEST(Vit, RegistersLayerScaleAndTheNoEmbedClassRule) {
  Network network(load_model_description("uni2-h", 2), Shape{1, 3, 224, 224}, false);
  Parameters p = parameters(network);
  EXPECT_TRUE(p.names.count("reg_token"));
  EXPECT_TRUE(p.names.count("blocks.23.ls2.gamma"));
  for (auto& layer : network.layers())
    for (auto& spec : layer.specs) {
      if (spec.name == "reg_token") {
        EXPECT_EQ(spec.shape, (Shape{1, 8, 1536}));
      }
      if (spec.name == "pos_embed") {
        EXPECT_EQ(spec.shape, (Shape{1, 256, 1536}));  // patches only
      }
    }
  // 16x16 patches, a class token and 8 registers; "blocks.3" names the block's output.
  EXPECT_EQ(network.layer("tokens").output_shape, (Shape{1, 265, 1536}));
  EXPECT_EQ(network.layer("blocks.3").name, "blocks.3.residual2");
}

// TRIDENT's names (its encoder_factory) for the same encoders are accepted as they are.
TEST(Vit, TridentNamesMeanThePresets) {
  const std::pair<const char*, const char*> names[] = {
      {"uni_v1", "uni"},          {"uni_v2", "uni2-h"},         {"virchow2", "virchow2"},
      {"hoptimus0", "h-optimus-0"}, {"hoptimus1", "h-optimus-1"}, {"h0-mini", "h0-mini"},
      {"gigapath", "prov-gigapath"}, {"kaiko-vits8", "kaiko-vits8"}, {"kaiko-vits16", "kaiko-vits16"},
      {"kaiko-vitb8", "kaiko-vitb8"}, {"kaiko-vitb16", "kaiko-vitb16"}, {"kaiko-vitl14", "kaiko-vitl14"},
      {"lunit-vits8", "lunit-vits8"}, {"virchow", "virchow"},       {"phikon_v2", "phikon-v2"},
      {"midnight12k", "midnight"}, {"conch_v15", "conch-v1.5"}, {"hibou_l", "hibou-l"}};
  for (auto [trident, preset] : names) {
    SCOPED_TRACE(trident);
    EXPECT_EQ(vit_preset_name(trident), std::optional<std::string>(preset));
    nlohmann::json graph = vit_graph({{"preset", trident}}), own = vit_graph({{"preset", preset}});
    EXPECT_EQ(graph, own);  // the same layers, named as tessera's preset
    EXPECT_EQ(load_model_description(trident, 2), load_model_description(preset, 2));
  }
  for (const char* unknown : {"conch_v1", "hibou_b", "uni_v3", "UNI"}) EXPECT_FALSE(vit_preset_name(unknown));
  EXPECT_NE(vit_preset_list().find("uni2-h (uni_v2)"), std::string::npos) << vit_preset_list();
  EXPECT_NE(vit_preset_list().find("kaiko-vits8, lunit-vits8"), std::string::npos) << vit_preset_list();
}

// kaiko's ViT-L/14 is timm's vit_large_patch14_reg4_dinov2 built at 518 pixels: its position
// embedding covers a 37x37 grid of patches only, resampled for 224-pixel tiles (16x16).
TEST(Vit, KaikoVitL14ResamplesItsPositionGridFor224PixelTiles) {
  Network network(load_model_description("kaiko-vitl14", 2), Shape{1, 3, 224, 224}, false);
  EXPECT_EQ(network.layer("tokens").output_shape, (Shape{1, 261, 1024}));
  Shape position, resampled;
  for (auto& spec : network.layer("tokens").specs) {
    if (spec.name == "pos_embed") position = spec.shape;
    if (spec.name == "resampled_pos_embed") resampled = spec.shape;
  }
  EXPECT_EQ(position, (Shape{1, 37 * 37, 1024}));
  EXPECT_EQ(resampled, (Shape{16 * 16, 1024}));
  // Lunit's and kaiko's ViT-S/8: 28x28 patches and the class token.
  Network lunit(load_model_description("lunit-vits8", 2), Shape{1, 3, 224, 224}, false);
  EXPECT_EQ(lunit.layer("tokens").output_shape, (Shape{1, 785, 384}));
}

// CONCH v1.5's trunk is built at 224 pixels (14x14) and run on 448-pixel tiles: DINO's interpolation
// to 28x28 (785 tokens), then attn_pool_contrast (1024 -> 768) and ln_contrast, weights named as CONCH's.
TEST(Vit, ConchV15PoolsItsTrunksTokensWithOneLearnedQuery) {
  auto tokens_layer = [](const nlohmann::json& graph) {
    for (auto& layer : graph["layers"])
      if (layer["name"] == "tokens") return layer;
    return nlohmann::json();
  };
  nlohmann::json graph = load_model_description("conch-v1.5", 2);
  EXPECT_EQ(tokens_layer(graph)["position_resample"], "bicubic_by_scale_factor");
  Network network(graph, Shape{1, 3, 448, 448}, false);
  EXPECT_EQ(network.layer("tokens").output_shape, (Shape{1, 785, 1024}));
  EXPECT_EQ(network.layer("attn_pool_contrast").output_shape, (Shape{1, 768}));
  EXPECT_EQ(network.layers().back().name, "ln_contrast");
  EXPECT_EQ(network.layers().back().output_shape, (Shape{1, 768}));
  EXPECT_EQ(timm_parameter_piece("trunk.blocks.23.ls2.gamma").name, "blocks.23.ls2.gamma");
  EXPECT_EQ(timm_parameter_piece("attn_pool_contrast.to_kv.weight").name, "attn_pool_contrast.to_kv.weight");
  // The other presets keep timm's resample.
  EXPECT_EQ(tokens_layer(load_model_description("uni", 2))["position_resample"], "timm");
  EXPECT_THROW(vit_graph({{"preset", "conch-v1.5"}, {"pool_heads", 7}}), ModelError);
}

TEST(Vit, AnotherInputSizeResamplesThePositionEmbedding) {
  Network network(load_model_description("uni", 2), Shape{1, 3, 512, 512}, false);
  EXPECT_EQ(network.layer("tokens").output_shape, (Shape{1, 1025, 1024}));
  bool resampled = false;
  for (auto& spec : network.layer("tokens").specs) resampled = resampled || spec.name == "resampled_pos_embed";
  EXPECT_TRUE(resampled);
}

void expect_model_error(const nlohmann::json& description, const std::string& part) {
  try {
    Network(description, Shape{1, 3, 32, 32}, false);
    ADD_FAILURE() << description.dump() << " was accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Vit, DescriptionsAreCheckedFieldByField) {
  nlohmann::json small = {{"family", "vit"}, {"image_size", 32}, {"patch_size", 8},
                          {"width", 48},     {"depth", 1},       {"heads", 3}};
  EXPECT_NO_THROW(Network(small, Shape{1, 3, 32, 32}, false));
  auto with = [&](const char* field, nlohmann::json value) {
    nlohmann::json changed = small;
    changed[field] = value;
    return changed;
  };
  expect_model_error(with("heads", 5), "field 'heads' must divide width 48");
  expect_model_error(with("image_size", 30), "field 'image_size' must be a multiple of patch_size 8");
  expect_model_error(with("mlp", "relu"), "field 'mlp' must be one of 'gelu', 'swiglu'");
  expect_model_error(with("depth", 0), "field 'depth' must be an integer from 1 to 256, got 0");
  // Limits past every real ViT, checked before any layer is made.
  expect_model_error(with("depth", 257), "field 'depth' must be an integer from 1 to 256, got 257");
  expect_model_error(with("width", 16400), "field 'width' must be an integer from 1 to 16384, got 16400");
  expect_model_error(with("heads", 49), "field 'heads' must be an integer from 1 to 48, got 49");
  expect_model_error(with("mlp_ratio", 16.5), "field 'mlp_ratio' must be above 0 and at most 16");
  expect_model_error(with("mlp_ratio", std::nan("")), "field 'mlp_ratio' must be above 0 and at most 16");
  expect_model_error(with("mlp_ratio", -1), "field 'mlp_ratio' must be above 0 and at most 16");
  expect_model_error(with("patch_size", 64), "field 'patch_size' must be at most image_size 32");
  expect_model_error(with("image_size", 70000), "field 'image_size' must be an integer from 1 to 65535, got 70000");
  nlohmann::json many_tokens = with("image_size", 4104);  // (4104 / 8)^2 + 1 = 263170 tokens
  expect_model_error(many_tokens, "field 'image_size' gives 263170 tokens");
  expect_model_error(with("register_tokens", 65520), "field 'register_tokens' gives 65537 tokens");
  expect_model_error(with("layer_scale", 1e300), "field 'layer_scale' must be from -1000 to 1000");
  expect_model_error(with("norm_eps", 0), "field 'norm_eps' must be above 0 and at most 1");
  expect_model_error(with("classes", 70000), "field 'classes' must be an integer from 0 to 65535, got 70000");
  // At the limit: 65536 tokens ((2040 / 8)^2, the class token and 510 registers), one more refused.
  nlohmann::json at_limit = with("image_size", 2040);
  at_limit["register_tokens"] = 510;
  EXPECT_NO_THROW(vit_graph(at_limit));
  at_limit["register_tokens"] = 511;
  expect_model_error(at_limit, "field 'image_size' gives 65537 tokens");
  expect_model_error(with("dropout", 0.1), "field 'dropout' is not a field of vit");
  nlohmann::json odd = with("mlp", "swiglu");
  odd["mlp_ratio"] = 1.021;  // int(48 * 1.021) = 49 hidden features: not two halves
  expect_model_error(odd, "the packed SwiGLU needs an even number");
  expect_model_error(with("class_token", false), "field 'output' 'class_token' needs class_token");
  expect_model_error({{"preset", "uni3"}}, "preset 'uni3' is not known");
}

TEST(Vit, ViTsRunInInferenceOnly) {
  nlohmann::json small = {{"family", "vit"}, {"image_size", 16}, {"patch_size", 8}, {"width", 8},
                          {"depth", 1},      {"heads", 2},       {"classes", 2}};
  EXPECT_THROW(Network(small, Shape{1, 3, 16, 16}, true), ModelError);
}

TEST(Vit, PublishersNamesMapToTimms) {
  const std::pair<const char*, ParameterPiece> names[] = {
      // torchvision's VisionTransformer
      {"conv_proj.weight", {"patch_embed.proj.weight"}},
      {"class_token", {"cls_token"}},
      {"encoder.pos_embedding", {"pos_embed"}},
      {"encoder.layers.encoder_layer_11.ln_1.bias", {"blocks.11.norm1.bias"}},
      {"encoder.layers.encoder_layer_0.self_attention.in_proj_weight", {"blocks.0.attn.qkv.weight"}},
      {"encoder.layers.encoder_layer_0.self_attention.out_proj.bias", {"blocks.0.attn.proj.bias"}},
      {"encoder.layers.encoder_layer_3.ln_2.weight", {"blocks.3.norm2.weight"}},
      {"encoder.layers.encoder_layer_3.mlp.0.weight", {"blocks.3.mlp.fc1.weight"}},
      {"encoder.layers.encoder_layer_3.mlp.linear_2.bias", {"blocks.3.mlp.fc2.bias"}},
      {"encoder.ln.weight", {"norm.weight"}},
      {"heads.head.bias", {"head.bias"}},
      // Hugging Face's Dinov2
      {"embeddings.cls_token", {"cls_token"}},
      {"embeddings.register_tokens", {"reg_token"}},
      {"embeddings.mask_token", {""}},
      {"embeddings.position_embeddings", {"pos_embed"}},
      {"embeddings.patch_embeddings.projection.bias", {"patch_embed.proj.bias"}},
      {"encoder.layer.7.norm2.weight", {"blocks.7.norm2.weight"}},
      {"encoder.layer.7.attention.attention.query.weight", {"blocks.7.attn.qkv.weight", 0, 3}},
      {"encoder.layer.7.attention.attention.key.bias", {"blocks.7.attn.qkv.bias", 1, 3}},
      {"encoder.layer.17.attention.attention.value.weight", {"blocks.17.attn.qkv.weight", 2, 3}},
      {"encoder.layer.7.attention.output.dense.weight", {"blocks.7.attn.proj.weight"}},
      {"encoder.layer.7.layer_scale2.lambda1", {"blocks.7.ls2.gamma"}},
      {"encoder.layer.7.mlp.fc1.bias", {"blocks.7.mlp.fc1.bias"}},
      {"encoder.layer.7.mlp.weights_out.weight", {"blocks.7.mlp.fc2.weight"}},
      {"layernorm.bias", {"norm.bias"}},
      {"blocks.0.attn.qkv.weight", {"blocks.0.attn.qkv.weight"}},  // timm's own, unchanged
  };
  for (auto& [published, expected] : names) {
    ParameterPiece piece = timm_parameter_piece(published);
    EXPECT_EQ(piece.name, expected.name) << published;
    EXPECT_EQ(piece.piece, expected.piece) << published;
    EXPECT_EQ(piece.pieces, expected.pieces) << published;
  }
}

}  // namespace
}  // namespace tessera
