"""CTransPath in plain PyTorch (neither timm 0.5.4 nor CTransPath's fork of it, timm_ctp, is
packaged for Debian), the twin of tessera's `swin` model family (compute/swin.h).

Written from the sources: Xiyue-Wang/TransPath ctran.py (ConvStem; ctranspath() =
create_model('swin_tiny_patch4_window7_224', embed_layer=ConvStem), model.head = nn.Identity()) as
mahmoodlab/TRIDENT's model_zoo/ctranspath/ctran.py copies it, and timm 0.5.4's
timm/models/swin_transformer.py (huggingface/pytorch-image-models at v0.5.4: window_partition,
window_reverse, WindowAttention with its relative_position_bias_table and relative_position_index
buffer, SwinTransformerBlock with its cyclic shift and attn_mask buffer, PatchMerging, BasicLayer,
SwinTransformer.forward_features), with their module names, so that CTransPath's checkpoint
(torch.save({'model': state_dict})) loads here unchanged, buffers and all. Settings are
compute/vit_presets.json's (its "ctranspath" entry, "family": "swin"), overridable ("depths").
"""
import json
import os

import torch
from torch import nn

PRESETS_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compute", "vit_presets.json")
with open(PRESETS_PATH) as presets_file:
    SWIN_PRESETS = {name: s for name, s in json.load(presets_file).items() if s.get("family") == "swin"}


def swin_settings(description):
    """A swin description ({"preset": NAME, overrides}) completed from its preset."""
    settings = dict(SWIN_PRESETS[description["preset"]]) if "preset" in description else {}
    settings.update({k: v for k, v in description.items() if k not in ("preset", "family")})
    return settings


class ConvStem(nn.Module):
    """ctran.py's ConvStem (patch_size 4): two Conv3x3 stride 2 without bias, BatchNorm, ReLU, then a
    1x1 convolution to embed_dim; flattened to tokens; norm is Swin's patch_norm LayerNorm."""

    def __init__(self, embed_dim, eps, bn_eps):
        super().__init__()
        stem, input_dim, output_dim = [], 3, embed_dim // 8
        for _ in range(2):
            stem += [nn.Conv2d(input_dim, output_dim, kernel_size=3, stride=2, padding=1, bias=False),
                     nn.BatchNorm2d(output_dim, eps=bn_eps), nn.ReLU(inplace=True)]
            input_dim, output_dim = output_dim, output_dim * 2
        stem.append(nn.Conv2d(input_dim, embed_dim, kernel_size=1))
        self.proj = nn.Sequential(*stem)
        self.norm = nn.LayerNorm(embed_dim, eps=eps)

    def forward(self, x):
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


def window_partition(x, w):
    B, H, W, C = x.shape
    x = x.view(B, H // w, w, W // w, w, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, w, w, C)


def window_reverse(windows, w, H, W):
    B = int(windows.shape[0] / (H * W / w / w))
    x = windows.view(B, H // w, W // w, w, w, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim, w, heads, qkv_bias):
        super().__init__()
        self.w, self.heads = w, heads
        self.scale = (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * w - 1) * (2 * w - 1), heads))
        coords = torch.stack(torch.meshgrid([torch.arange(w), torch.arange(w)], indexing="ij")).flatten(1)
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        relative[:, :, 0] += w - 1
        relative[:, :, 1] += w - 1
        relative[:, :, 0] *= 2 * w - 1
        self.register_buffer("relative_position_index", relative.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask):
        B_, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, N, N)
        return self.proj((attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(B_, N, C))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, resolution, heads, w, shift, mlp_ratio, qkv_bias, eps):
        super().__init__()
        self.resolution, self.w, self.shift = resolution, w, shift
        if min(resolution) <= self.w:  # timm: one window, no shift
            self.shift, self.w = 0, min(resolution)
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = WindowAttention(dim, self.w, heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        attn_mask = None
        if self.shift > 0:
            H, W = resolution
            img_mask = torch.zeros((1, H, W, 1))
            slices = (slice(0, -self.w), slice(-self.w, -self.shift), slice(-self.shift, None))
            count = 0
            for h in slices:
                for s in slices:
                    img_mask[:, h, s, :] = count
                    count += 1
            mask_windows = window_partition(img_mask, self.w).view(-1, self.w * self.w)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H, W = self.resolution
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift > 0:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        windows = window_partition(x, self.w).view(-1, self.w * self.w, C)
        windows = self.attn(windows, self.attn_mask).view(-1, self.w, self.w, C)
        x = window_reverse(windows, self.w, H, W)
        if self.shift > 0:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, resolution, dim, eps):
        super().__init__()
        self.resolution = resolution
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim, eps=eps)

    def forward(self, x):
        H, W = self.resolution
        B, L, C = x.shape
        x = x.view(B, H, W, C)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x.view(B, -1, 4 * C)))


class BasicLayer(nn.Module):
    def __init__(self, dim, resolution, depth, heads, w, mlp_ratio, qkv_bias, eps, downsample):
        super().__init__()
        self.blocks = nn.ModuleList([
            SwinTransformerBlock(dim, resolution, heads, w, 0 if i % 2 == 0 else w // 2, mlp_ratio, qkv_bias, eps)
            for i in range(depth)])
        self.downsample = PatchMerging(resolution, dim, eps) if downsample else None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.downsample(x) if self.downsample is not None else x


class SwinTransformer(nn.Module):
    """timm 0.5.4's SwinTransformer with CTransPath's ConvStem, head nn.Identity(): forward gives
    forward_features, the final norm's tokens averaged (768-d for CTransPath)."""

    def __init__(self, description):
        super().__init__()
        s = self.settings = swin_settings(description)
        assert s.get("patch_size", 4) == 4, "ConvStem asserts patch_size 4"
        width, eps, depths = s["width"], s.get("norm_eps", 1e-5), s["depths"]
        self.patch_embed = ConvStem(width, eps, s.get("batch_norm_eps", 1e-5))
        grid = s["image_size"] // 4
        self.layers = nn.Sequential(*[
            BasicLayer(width * 2 ** i, (grid // 2 ** i, grid // 2 ** i), depth, s["heads"][i], s.get("window", 7),
                       s.get("mlp_ratio", 4.0), s.get("qkv_bias", True), eps, i < len(depths) - 1)
            for i, depth in enumerate(depths)])
        self.norm = nn.LayerNorm(width * 2 ** (len(depths) - 1), eps=eps)

    def forward(self, images):
        x = self.norm(self.layers(self.patch_embed(images)))
        return x.mean(dim=1)  # AdaptiveAvgPool1d(1) over x.transpose(1, 2), flattened


def derived_buffer(name):
    """The buffers a module derives from its shape, which tessera never reads (compute/vit.cpp)."""
    return name.endswith(("relative_position_index", "attn_mask", "num_batches_tracked"))
