// The `swin` model family (compute/swin.h): the ctranspath preset is CTransPath as Xiyue-Wang/
// TransPath's ctran.py and timm 0.5.4's swin_transformer.py build it (27,520,038 parameters, as
// tools/swin_reference.py's module counts them; CTransPath's paper: 28M), with its module's names,
// windows shifted in every second block but where a stage's grid is one window (TRIDENT's
// CTransPath loader expects exactly five attn_mask buffers: layers.0.blocks.1, layers.1.blocks.1,
// layers.2.blocks.1, .3 and .5), its derived buffers skipped when weights are read, and
// descriptions checked field by field. Outputs against PyTorch: tests/test_ctranspath.py.
#include <gtest/gtest.h>

#include <set>

#include "compute/network.h"
#include "compute/ops/registry.h"
#include "compute/vit.h"

namespace tessera {
namespace {

TEST(Swin, CTransPathIsTimmsSwinTinyWithItsConvStem) {
  EXPECT_EQ(vit_preset_name("ctranspath"), std::optional<std::string>("ctranspath"));
  Network network(load_model_description("ctranspath", 2), Shape{2, 3, 224, 224}, false);
  EXPECT_EQ(network.output_shape(), (Shape{2, 768}));
  int64_t parameters = 0;
  std::set<std::string> names;
  for (auto& layer : network.layers())
    for (auto& spec : layer.specs)
      if (in_checkpoint(spec.role)) {
        if (spec.role == TensorRole::parameter) parameters += element_count(spec.shape);
        names.insert(tensor_name(layer.name, spec));
      }
  EXPECT_EQ(parameters, 27520038);
  for (const char* name :
       {"patch_embed.proj.0.weight", "patch_embed.proj.1.running_var", "patch_embed.proj.3.weight",
        "patch_embed.proj.4.bias", "patch_embed.proj.6.weight", "patch_embed.proj.6.bias", "patch_embed.norm.weight",
        "layers.0.blocks.0.attn.relative_position_bias_table", "layers.0.blocks.1.attn.qkv.bias",
        "layers.2.blocks.5.mlp.fc2.weight", "layers.2.downsample.norm.weight", "layers.2.downsample.reduction.weight",
        "layers.3.blocks.1.attn.proj.bias", "norm.bias"})
    EXPECT_TRUE(names.count(name)) << name;
  for (const char* absent : {"patch_embed.proj.0.bias", "layers.0.downsample.reduction.bias", "layers.3.downsample.norm.weight",
                             "head.weight"})
    EXPECT_FALSE(names.count(absent)) << absent;

  std::set<std::string> shifted;
  const nlohmann::json graph = expand_presets({{"preset", "ctranspath"}});
  for (auto& layer : graph["layers"])
    if (layer["type"] == "window_attention") {
      EXPECT_EQ(layer["window"], 7) << layer["name"];
      if (layer["shift"] != 0) {
        EXPECT_EQ(layer["shift"], 3);
        shifted.insert(layer["name"].get<std::string>());
      }
    }
  EXPECT_EQ(shifted, (std::set<std::string>{"layers.0.blocks.1.attn", "layers.1.blocks.1.attn", "layers.2.blocks.1.attn",
                                            "layers.2.blocks.3.attn", "layers.2.blocks.5.attn"}));
}

TEST(Swin, DerivedBuffersAreSkippedWhenWeightsAreRead) {
  for (const char* buffer : {"layers.0.blocks.1.attn_mask", "layers.2.blocks.4.attn.relative_position_index",
                             "patch_embed.proj.1.num_batches_tracked"})
    EXPECT_TRUE(timm_parameter_piece(buffer).name.empty()) << buffer;
  EXPECT_EQ(timm_parameter_piece("layers.0.blocks.1.attn.relative_position_bias_table").name,
            "layers.0.blocks.1.attn.relative_position_bias_table");
}

TEST(Swin, DescriptionsAreCheckedFieldByField) {
  // 200 pixels: a 50-token grid, no multiple of the window (timm 0.5.4 neither pads nor crops).
  for (const nlohmann::json& bad :
       {nlohmann::json{{"preset", "ctranspath"}, {"image_size", 200}},
        nlohmann::json{{"preset", "ctranspath"}, {"heads", {3, 6, 12}}},
        nlohmann::json{{"preset", "ctranspath"}, {"heads", {3, 5, 12, 24}}},
        nlohmann::json{{"preset", "ctranspath"}, {"depths", nlohmann::json::array()}},
        nlohmann::json{{"preset", "ctranspath"}, {"patch_size", 8}},
        nlohmann::json{{"preset", "ctranspath"}, {"ape", true}},
        nlohmann::json{{"preset", "ctranspath"}, {"window", 0}}}) {
    SCOPED_TRACE(bad.dump());
    EXPECT_THROW(expand_presets(bad), ModelError);
  }
  // Two stages at 112 pixels: grids of 28 and 14, both multiples of 7.
  Network small(nlohmann::json{{"preset", "ctranspath"}, {"image_size", 112}, {"depths", {2, 2}}, {"heads", {3, 6}}},
                Shape{1, 3, 112, 112}, false);
  EXPECT_EQ(small.output_shape(), (Shape{1, 192}));
}

}  // namespace
}  // namespace tessera
