"""timm's VisionTransformer in plain PyTorch (timm is not packaged for Debian), the twin of
tessera's `vit` model family (compute/vit.h), and the helpers the converter and tests share.

Written from timm's source (timm/models/vision_transformer.py: VisionTransformer, Block,
_pos_embed, global_pool_nlc; timm/layers: Attention, Mlp, GluMlp with SwiGLUPacked =
GluMlp(act_layer=SiLU, gate_last=False), LayerScale, PatchEmbed, pos_embed.resample_abs_pos_embed),
with timm's parameter names, so a state_dict of timm's model loads here unchanged. Settings are
those of compute/vit_presets.json (read from there, one source for C++ and Python). CONCH v1.5
(mahmoodlab/TRIDENT model_zoo/conchv1_5/conchv1_5.py): DINO's interpolate_pos_encoding and the
AttentionalPooler attn_pool_contrast with ln_contrast, CONCH's names less the trunk's "trunk." prefix.
"""
import json
import os
import re

import torch
import torch.nn.functional as F
from torch import nn

PRESETS_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compute", "vit_presets.json")
with open(PRESETS_PATH) as presets_file:
    VIT_PRESETS = json.load(presets_file)
# TRIDENT's names for the presets (their "trident" field; mahmoodlab/TRIDENT's encoder_factory),
# where they differ from tessera's: "uni_v2" -> "uni2-h".
TRIDENT_NAMES = {s["trident"]: name for name, s in VIT_PRESETS.items() if s.get("trident", name) != name}


def vit_preset_name(name):
    """The preset a name means (its own, or TRIDENT's for it), as compute/vit.cpp; None: not one."""
    return name if name in VIT_PRESETS else TRIDENT_NAMES.get(name)

DEFAULTS = {"mlp": "gelu", "mlp_ratio": 4.0, "class_token": True, "register_tokens": 0, "layer_scale": None,
            "position_embedding": "tokens", "position_resample": "timm", "qkv_bias": True, "norm_eps": 1e-6, "final_norm": "tokens",
            "output": "class_token", "classes": 0, "pool_norm_eps": 1e-5}


def vit_settings(description):
    """A ViT description ({"preset": NAME, overrides} or {"family": "vit", ...}) completed with
    tessera's defaults, as compute/vit.cpp completes it."""
    settings = dict(DEFAULTS)
    if "preset" in description:
        settings.update(VIT_PRESETS[vit_preset_name(description["preset"])])
    settings.update({k: v for k, v in description.items() if k not in ("preset", "family")})
    return settings


def is_vit_description(description):
    return description.get("family") in ("vit", "swin") or vit_preset_name(description.get("preset")) is not None


class Attention(nn.Module):
    def __init__(self, dim, heads, qkv_bias, device):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias, device=device)
        self.proj = nn.Linear(dim, dim, device=device)

    def forward(self, x):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attention = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attention @ v).transpose(1, 2).reshape(batch, tokens, dim))


class Mlp(nn.Module):
    """timm's Mlp (fc1, GELU, fc2), or with packed SwiGLU its GluMlp(gate_last=False): fc1's output
    splits into halves x1 | x2 and silu(x1) * x2 goes on to fc2."""

    def __init__(self, dim, hidden, kind, device):
        super().__init__()
        self.kind = kind
        self.fc1 = nn.Linear(dim, hidden, device=device)
        self.fc2 = nn.Linear(hidden // 2 if kind == "swiglu" else hidden, dim, device=device)

    def forward(self, x):
        x = self.fc1(x)
        if self.kind == "swiglu":
            x1, x2 = x.chunk(2, dim=-1)
            x = F.silu(x1) * x2
        else:
            x = F.gelu(x)
        return self.fc2(x)


class LayerScale(nn.Module):
    def __init__(self, dim, init, device):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init), device=device))

    def forward(self, x):
        return x * self.gamma


class Block(nn.Module):
    def __init__(self, s, device):
        super().__init__()
        dim = s["width"]
        self.norm1 = nn.LayerNorm(dim, eps=s["norm_eps"], device=device)
        self.attn = Attention(dim, s["heads"], s["qkv_bias"], device)
        self.ls1 = LayerScale(dim, s["layer_scale"], device) if s["layer_scale"] is not None else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=s["norm_eps"], device=device)
        self.mlp = Mlp(dim, int(dim * s["mlp_ratio"]), s["mlp"], device)
        self.ls2 = LayerScale(dim, s["layer_scale"], device) if s["layer_scale"] is not None else nn.Identity()

    def forward(self, x):
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


def resample_abs_pos_embed(posemb, new_size, old_size, num_prefix_tokens, antialias=True):
    """timm's resample_abs_pos_embed (bicubic, antialias=True), the prefix tokens' rows kept; with
    antialias=False, Hugging Face Dinov2's interpolate_pos_encoding (bicubic to the new size)."""
    if tuple(new_size) == tuple(old_size):
        return posemb
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    dim = grid.shape[-1]
    grid = grid.float().reshape(1, old_size[0], old_size[1], -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(new_size), mode="bicubic", antialias=antialias, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim)
    return torch.cat([prefix, grid], dim=1)


def interpolate_by_scale_factor(posemb, new_size, old_size, num_prefix_tokens):
    """DINO's and iBOT's interpolate_pos_encoding (CONCH v1.5's trunk): bicubic by the scale factor
    (new + 0.1) / old, not antialiased, the prefix tokens' rows kept."""
    if tuple(new_size) == tuple(old_size):
        return posemb
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    dim = grid.shape[-1]
    grid = grid.reshape(1, old_size[0], old_size[1], dim).permute(0, 3, 1, 2)
    scale = ((new_size[0] + 0.1) / old_size[0], (new_size[1] + 0.1) / old_size[1])
    grid = F.interpolate(grid, scale_factor=scale, mode="bicubic").permute(0, 2, 3, 1).reshape(1, -1, dim)
    return torch.cat([prefix, grid], dim=1)


class AttentionalPool(nn.Module):
    """CONCH v1.5's AttentionalPooler: learned queries (ln_q) over every token (ln_k), bias-free
    to_q, to_kv (keys then values) and to_out, softmax(q k^T / sqrt(head)) v per head."""

    def __init__(self, width, context, heads, eps, device):
        super().__init__()
        self.heads = heads
        self.query = nn.Parameter(torch.randn(1, width, device=device))
        self.ln_k = nn.LayerNorm(context, eps=eps, device=device)
        self.ln_q = nn.LayerNorm(width, eps=eps, device=device)
        self.to_q = nn.Linear(width, width, bias=False, device=device)
        self.to_kv = nn.Linear(context, 2 * width, bias=False, device=device)
        self.to_out = nn.Linear(width, width, bias=False, device=device)

    def forward(self, x):
        def heads(t):  # [..., n, width] -> [..., heads, n, head]
            return t.unflatten(-1, (self.heads, -1)).transpose(-3, -2)

        q = heads(self.to_q(self.ln_q(self.query)))
        k, v = (heads(t) for t in self.to_kv(self.ln_k(x)).chunk(2, dim=-1))
        weights = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
        return self.to_out((weights @ v).transpose(-3, -2).flatten(-2))


class VisionTransformer(nn.Module):
    """Images [N,3,H,W] -> the output rule's features [N, D or 2D] (or logits with a head)."""

    def __init__(self, description, device=None):
        super().__init__()
        s = self.settings = vit_settings(description)
        dim, patch = s["width"], s["patch_size"]
        self.grid = (s["image_size"] // patch, s["image_size"] // patch)
        self.prefix = int(s["class_token"]) + s["register_tokens"]
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, dim, patch, stride=patch, device=device)
        self.cls_token = nn.Parameter(1e-6 * torch.randn(1, 1, dim, device=device)) if s["class_token"] else None
        registers = s["register_tokens"]
        self.reg_token = nn.Parameter(1e-6 * torch.randn(1, registers, dim, device=device)) if registers else None
        if s["position_embedding"] != "none":
            rule = s["position_embedding"]
            covered = {"tokens": self.prefix, "class_and_patches": int(s["class_token"])}.get(rule, 0)
            rows = covered + self.grid[0] * self.grid[1]
            self.pos_embed = nn.Parameter(0.02 * torch.randn(1, rows, dim, device=device))
        else:
            self.pos_embed = None
        self.blocks = nn.Sequential(*[Block(s, device) for _ in range(s["depth"])])
        eps = s["norm_eps"]
        self.norm = nn.LayerNorm(dim, eps=eps, device=device) if s["final_norm"] == "tokens" else nn.Identity()
        self.fc_norm = nn.LayerNorm(dim, eps=eps, device=device) if s["final_norm"] == "pooled" else nn.Identity()
        if s["output"] == "attentional_pool":
            eps, width = s["pool_norm_eps"], s["pool_width"]
            self.attn_pool_contrast = AttentionalPool(width, dim, s["pool_heads"], eps, device)
            self.ln_contrast = nn.LayerNorm(width, eps=eps, device=device)
            dim = width
        self.head = nn.Linear(dim, s["classes"], device=device) if s["classes"] > 0 else nn.Identity()

    def _pos_embed(self, x, grid):
        to_cat = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.pos_embed is None:
            return torch.cat(to_cat + [x], dim=1)
        rule = self.settings["position_embedding"]
        covered = {"tokens": self.prefix, "class_and_patches": int(self.cls_token is not None)}.get(rule, 0)
        if self.settings["position_resample"] == "bicubic_by_scale_factor":
            pos_embed = interpolate_by_scale_factor(self.pos_embed, grid, self.grid, covered)
        else:
            pos_embed = resample_abs_pos_embed(self.pos_embed, grid, self.grid, covered,
                                               antialias=self.settings["position_resample"] == "timm")
        if rule == "patches":
            return torch.cat(to_cat + [x + pos_embed], dim=1)
        if rule == "class_and_patches":  # Dinov2WithRegisters: the registers join after the embedding is added
            x = torch.cat(to_cat[:covered] + [x], dim=1) + pos_embed
            return torch.cat([x[:, :covered]] + to_cat[covered:] + [x[:, covered:]], dim=1)
        return torch.cat(to_cat + [x], dim=1) + pos_embed

    def forward_tokens(self, images):
        x = self.patch_embed.proj(images)
        grid = x.shape[-2:]
        x = self._pos_embed(x.flatten(2).transpose(1, 2), grid)
        return self.norm(self.blocks(x))

    def forward(self, images):
        x = self.forward_tokens(images)
        output = self.settings["output"]
        if output == "class_token":
            x = x[:, 0]
        elif output == "patch_mean":
            x = x[:, self.prefix:].mean(dim=1)
        elif output == "attentional_pool":  # CONCH v1.5: one query over every token
            x = self.ln_contrast(self.attn_pool_contrast(x)[:, 0])
        else:  # Virchow2: the class token joined with the mean of the patch tokens
            x = torch.cat([x[:, 0], x[:, self.prefix:].mean(dim=1)], dim=-1)
        return self.head(self.fc_norm(x))


def expected_vit_shapes(description):
    """name -> shape of every parameter of a ViT description, built without memory (meta)."""
    model = VisionTransformer(description, device="meta")
    return {name: tuple(value.shape) for name, value in model.state_dict().items()}


# torchvision's VisionTransformer names (and CONCH v1.5's trunk) -> timm's (compute/vit.cpp's timm_parameter_piece).
TORCHVISION_RENAMES = [
    (r"^trunk\.", ""),  # CONCH v1.5's CONCHVisionTower: a timm ViT as its trunk
    (r"^conv_proj\.", "patch_embed.proj."),
    (r"^class_token$", "cls_token"),
    (r"^encoder\.pos_embedding$", "pos_embed"),
    (r"^encoder\.ln\.", "norm."),
    (r"^heads\.head\.", "head."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_1\.", r"blocks.\1.norm1."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_2\.", r"blocks.\1.norm2."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.in_proj_(weight|bias)$", r"blocks.\1.attn.qkv.\2"),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.out_proj\.", r"blocks.\1.attn.proj."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(0|linear_1)\.", r"blocks.\1.mlp.fc1."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(3|linear_2)\.", r"blocks.\1.mlp.fc2."),
]


def timm_parameter_name(name):
    for pattern, replacement in TORCHVISION_RENAMES:
        if re.search(pattern, name):
            return re.sub(pattern, replacement, name)
    return name
