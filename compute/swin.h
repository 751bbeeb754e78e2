// The `swin` model family: timm 0.5.4's SwinTransformer (huggingface/pytorch-image-models
// v0.5.4 timm/models/swin_transformer.py: the fork of timm CTransPath was trained with) as a graph
// of tessera's layers whose names are that module's, so that CTransPath's checkpoint loads as it
// ships: patch_embed.proj.{0..6} (CTransPath's ConvStem, Xiyue-Wang/TransPath ctran.py: two 3x3
// stride-2 convolutions without bias, each with BatchNorm2d and ReLU, 3 -> width/8 -> width/4,
// then a 1x1 convolution with bias to width; timm's own PatchEmbed is not built), patch_embed.norm (patch_norm), then per stage i
// layers.i.blocks.j.{norm1, attn.qkv, attn (its relative_position_bias_table), attn.proj, norm2,
// mlp.fc1, mlp.fc2} with every second block's windows shifted by window // 2, and
// layers.i.downsample.{norm, reduction} (PatchMerging) between stages; then norm and the mean over
// tokens (forward_features' avgpool). A stage whose grid is no larger than the window has one
// window and no shift, as timm's SwinTransformerBlock sets it.
//
// Settings (a ViT preset's file, compute/vit_presets.json, holds them with "family": "swin"):
// image_size, patch_size (4, as ConvStem asserts), width (embed_dim, a multiple of 8),
// depths and heads (one per stage), window, mlp_ratio, qkv_bias, norm_eps (nn.LayerNorm's 1e-5),
// batch_norm_eps (the stem's, 1e-5), name, and preprocessing, source and trident (for the
// encoders' users; not part of the graph). No absolute position embedding (ape: CTransPath's
// False) and no head (CTransPath's model.head = nn.Identity()): the output is the 8 x width-d mean.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace tessera {

// The graph ({"name", "layers"}) of the settings of a swin description; throws ModelError naming
// the field.
nlohmann::json swin_graph(nlohmann::json settings, const std::string& name);

}  // namespace tessera
