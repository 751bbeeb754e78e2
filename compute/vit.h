// The `vit` model family: vision transformers as timm's VisionTransformer builds them (the patch
// encoders of computational pathology: UNI, UNI2-h, Virchow2, H-optimus-0 and -1, H0-mini,
// Prov-GigaPath, kaiko.ai's ViT-S/B/L, Lunit's DINO ViT-S/8, Phikon-v2, Midnight, CONCH v1.5's trunk
// and pooler) and torchvision's vit_b_16, as graphs of tessera's layers whose parameters carry
// timm's names.
//
// A description is {"family": "vit", settings...} or {"preset": NAME, overrides...}; the presets
// are compute/vit_presets.json (each cites its model card), which the Python tools read too.
// Settings: image_size (the input the position embedding was learned for), patch_size, width,
// depth, heads, mlp ("gelu" or timm's packed "swiglu") and mlp_ratio (hidden = int(width *
// ratio), as timm), class_token, register_tokens, layer_scale (its initial value; absent: none),
// position_embedding ("tokens": over every token, timm's default; "patches": no_embed_class;
// "none"), position_resample (a grid learned at another size: "timm", antialiased bicubic;
// "bicubic", Hugging Face Dinov2's; "bicubic_by_scale_factor", DINO's interpolate_pos_encoding,
// CONCH v1.5's), qkv_bias, norm_eps, final_norm ("tokens": timm's norm; "pooled": its fc_norm; "none"),
// output ("class_token", "class_token_and_patch_mean" as Virchow2, "patch_mean", or
// "attentional_pool": CONCH v1.5's attn_pool_contrast, one learned query of pool_width features
// attending with pool_heads heads over every token, then ln_contrast, LayerNorms of eps
// pool_norm_eps), classes (a linear head named "head"; 0: none, the features), name, and
// preprocessing, source and trident (for the encoders' users; not part of the graph).
// preprocessing's input_size is the tiles an encoder reads where they differ from image_size
// (kaiko-vitl14: 224-pixel tiles, its position embedding learned at 518 and resampled).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/safetensors.h"

namespace tessera {

// The preset a name means: a preset's own name, or the name TRIDENT (mahmoodlab/TRIDENT's
// encoder_factory) gives the same encoder, its "trident" field ("uni_v2" is uni2-h); none: not one.
std::optional<std::string> vit_preset_name(const std::string& name);
// The presets for help texts and errors: "uni (uni_v1), uni2-h (uni_v2), ..., virchow2, ...".
std::string vit_preset_list();
// Whether `description` is a ViT: {"family": "vit"} or a ViT preset.
bool is_vit_description(const nlohmann::json& description);
// The settings of a ViT description, a preset's completed with its overrides.
nlohmann::json vit_settings(const nlohmann::json& description);
// The graph ({"name", "layers"}) of a ViT description; throws ModelError naming the field.
nlohmann::json vit_graph(const nlohmann::json& description);

// Where a tensor of a publisher's file goes in tessera's ViT, whose names are timm's:
// torchvision's VisionTransformer ("encoder.layers.encoder_layer_3.self_attention.in_proj_weight"
// -> "blocks.3.attn.qkv.weight") and Hugging Face's Dinov2 ("encoder.layer.3.attention.attention.
// key.weight" -> the second of three pieces of "blocks.3.attn.qkv.weight"); timm's own names
// unchanged; CONCH v1.5's "trunk." prefix dropped.
ParameterPiece timm_parameter_piece(const std::string& name);

}  // namespace tessera
