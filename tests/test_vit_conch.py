"""CONCH v1.5 (conch-v1.5, TRIDENT's default encoder conch_v15) against its publisher's definition.

The reference is CONCHVisionTower written in plain PyTorch from mahmoodlab/TRIDENT's
trident/patch_encoder_models/model_zoo/conchv1_5/conchv1_5.py (TRIDENT loads MahmoodLab/conchv1_5's
pytorch_model_vision.bin into it, strict): a timm/iBOT ViT-L/16 trunk with layer scale, built at 224
pixels and run on 448, its position embedding interpolated by interpolate_pos_encoding (bicubic by
the scale factor (28 + 0.1) / 14, as DINO), forward_features (the final norm over every token); the
AttentionalPooler attn_pool_contrast (ln_k over the 1024-d tokens, ln_q over one learned query of
768, bias-free to_q, to_kv and to_out, 8 heads of 96) and ln_contrast: the 768-d feature.

- Random weights (layer-scale gammas from 0.5 to 1.5), the trunk two blocks deep at ViT-L's width,
  written as a .safetensors file with CONCH's names (trunk.*, attn_pool_contrast.*, ln_contrast.*),
  run by `tessera extract --encoder` on real pixels of CMU-1-Small-Region.svs declared at 0.5714 um/px
  (448-pixel tiles of the 256 um that TRIDENT's 512-pixel patches at 20x cover; nothing resized):
  relative error under 1e-4 in fp32, under 1e-2 with --precision fp16.
- The same weights as CONCH ships them, a torch.save state_dict (pytorch_model_vision.bin), through
  tools/torch_to_tessera.py, likewise; and tools/vit_reference.py's conch-v1.5 agrees with the module here.
- The full preset's plan (extract --dry-run) holds exactly CONCHVisionTower's parameters in fp32, and
  TRIDENT's name conch_v15 plans the same model.
- A checkpoint of CONCH v1's pooler (nn.MultiheadAttention's in_proj_bias) or a misshapen tensor is
  exit 5 naming it, nothing written.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import openslide
import tifffile
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_vit_presets import CMU, EXIT_BAD_INPUT, IMAGENET, REPO, TOLERANCE, planned_parameter_bytes, run  # noqa: E402
from test_vit_timm import randomise_parameters, relative_error, write_safetensors  # noqa: E402
from vit_reference import VisionTransformer, timm_parameter_name  # noqa: E402

MICRONS_PER_PIXEL = 0.5 * 512 / 448  # TRIDENT's 512-pixel patches at 20x, resized to 448
TILE = 448


class Block(nn.Module):
    """timm's Block as conchv1_5.py has it: norm1, attn (qkv, proj), ls1; norm2, GELU Mlp, ls2."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(width, 3 * width)
        self.attn.proj = nn.Linear(width, width)
        self.ls1 = nn.Module()
        self.ls1.gamma = nn.Parameter(torch.ones(width))
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(width, 4 * width)
        self.mlp.fc2 = nn.Linear(4 * width, width)
        self.ls2 = nn.Module()
        self.ls2.gamma = nn.Parameter(torch.ones(width))

    def attention(self, x):
        n, tokens, width = x.shape
        qkv = self.attn.qkv(x).reshape(n, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        weights = ((q * (width // self.heads) ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.attn.proj((weights @ v).transpose(1, 2).reshape(n, tokens, width))

    def forward(self, x):
        x = x + self.attention(self.norm1(x)) * self.ls1.gamma
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x)))) * self.ls2.gamma


class Trunk(nn.Module):
    """vit_large(init_values=1.0) at img_size 224: patch 16, a class token, pos_embed over it and the
    14x14 patches, interpolated for other inputs as interpolate_pos_encoding does."""

    def __init__(self, depth, width=1024, heads=16, patch=16, image_size=224):
        super().__init__()
        grid = image_size // patch
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, width, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid + 1, width))
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.patch = patch

    def interpolate_pos_encoding(self, x, w, h):
        npatch, stored = x.shape[1] - 1, self.pos_embed.shape[1] - 1
        if npatch == stored and w == h:
            return self.pos_embed
        class_pos_embed, patch_pos_embed = self.pos_embed[:, 0], self.pos_embed[:, 1:]
        dim, side = x.shape[-1], math.sqrt(stored)
        w0, h0 = w // self.patch + 0.1, h // self.patch + 0.1
        patch_pos_embed = F.interpolate(
            patch_pos_embed.reshape(1, int(side), int(side), dim).permute(0, 3, 1, 2),
            scale_factor=(w0 / side, h0 / side), mode="bicubic")
        assert int(w0) == patch_pos_embed.shape[-2] and int(h0) == patch_pos_embed.shape[-1]
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1)

    def forward_features(self, pixels):
        _, _, w, h = pixels.shape
        x = self.patch_embed.proj(pixels).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.interpolate_pos_encoding(x, w, h)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class AttentionalPooler(nn.Module):
    """conchv1_5.py's AttentionalPooler (d_model 768, context_dim 1024, n_head 8, n_queries 1), its
    einops written out."""

    def __init__(self, d_model=768, context_dim=1024, n_head=8, n_queries=1):
        super().__init__()
        self.query = nn.Parameter(torch.randn(n_queries, d_model))
        self.heads = n_head
        self.ln_k = nn.LayerNorm(context_dim)
        self.ln_q = nn.LayerNorm(d_model)
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_kv = nn.Linear(context_dim, 2 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        n, tokens, _ = x.shape
        queries, width = self.query.shape
        head = width // self.heads
        q = self.to_q(self.ln_q(self.query)).view(queries, self.heads, head).transpose(0, 1)  # h q d
        k, v = self.to_kv(self.ln_k(x)).chunk(2, dim=-1)
        k = k.reshape(n, tokens, self.heads, head).transpose(1, 2)  # n h t d
        v = v.reshape(n, tokens, self.heads, head).transpose(1, 2)
        sim = torch.einsum("hid,nhjd->nhij", q * head ** -0.5, k)
        sim = sim - sim.amax(dim=-1, keepdim=True)
        out = torch.einsum("nhij,nhjd->nhid", sim.softmax(dim=-1), v)
        return self.to_out(out.transpose(1, 2).reshape(n, queries, width))


class ConchVisionTower(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.trunk = Trunk(depth)
        self.attn_pool_contrast = AttentionalPooler()
        self.ln_contrast = nn.LayerNorm(768)

    def forward(self, pixels):
        return self.ln_contrast(self.attn_pool_contrast(self.trunk.forward_features(pixels))[:, 0])


def randomised_conch(seed, depth):
    torch.manual_seed(seed)
    return randomise_parameters(ConchVisionTower(depth))


def write_conch_slide(directory):
    """Two 448-pixel tiles of real H&E (CMU-1), declared at 0.5714 um/px so that tessera reads them
    unresized, as a tiled TIFF: (the pixels, the slide's path)."""
    with openslide.OpenSlide(CMU) as slide:
        region = np.asarray(slide.read_region((500, 1100), 0, (2 * TILE, TILE)).convert("RGB"))
    path = os.path.join(directory, "cmu-conch.tif")
    tifffile.imwrite(path, region, tile=(256, 256), photometric="rgb",
                     resolution=(1e4 / MICRONS_PER_PIXEL, 1e4 / MICRONS_PER_PIXEL), resolutionunit="CENTIMETER")
    return region, path


# CONCHVisionTower's parameters at full depth (24 blocks), counted from the module above.
def conch_parameter_count():
    return sum(p.numel() for p in ConchVisionTower(24).parameters())


class ConchV15(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="tessera-vit-conch-")
        cls.region, cls.slide = write_conch_slide(cls.directory.name)

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def path(self, name):
        return os.path.join(self.directory.name, name)

    def encoder(self, depth, name="conch-v1.5"):
        encoder = self.path(f"{name}-{depth}.json")
        with open(encoder, "w") as f:
            json.dump({"preset": name, "depth": depth}, f)
        return encoder

    def extract(self, weights, out, *flags, depth=2):
        return run("extract", "--encoder", self.encoder(depth), "--model", weights, "--slides", self.slide,
                   "--min-tissue", 0, "--out", out, "--batch", 2, *flags)

    def expected(self, reference, coords):
        tiles = np.stack([self.region[y:y + TILE, x:x + TILE] for x, y in coords])
        x = torch.from_numpy(tiles).permute(0, 3, 1, 2).double() / 255
        mean, std = (torch.tensor(v, dtype=torch.float64).view(1, 3, 1, 1) for v in IMAGENET)
        with torch.no_grad():
            return reference((x - mean) / std).numpy()

    def test_conch_v15_with_conchs_names_matches_its_vision_tower(self):
        reference = randomised_conch(15, depth=2)
        weights = self.path("conch.safetensors")
        write_safetensors(weights, {k: v.float() for k, v in reference.state_dict().items()})
        expected = None  # the reference's features, on the coords both runs read
        for precision, tolerance in (("fp32", TOLERANCE), ("fp16", 1e-2)):
            with self.subTest(precision):
                out = self.path("conch-out-" + precision)
                result = self.extract(weights, out, "--precision", precision)
                self.assertEqual(result.returncode, 0, result.stderr[-3000:])
                self.assertNotIn("vulkan validation", result.stderr)
                with h5py.File(os.path.join(out, "cmu-conch.h5"), "r") as f:
                    features, coords = f["features"][...], f["coords"][...]
                    self.assertEqual((f["coords"].attrs["patch_size"], f["coords"].attrs["patch_level"]), (TILE, 0))
                self.assertEqual(features.shape, (2, 768))
                expected = self.expected(reference, coords) if expected is None else expected
                self.assertGreater(float(expected.std()), 1e-2)
                error = relative_error(features.astype(np.float64), expected)
                print(f"conch-v1.5 (depth 2, CONCH's names, {precision}) on 2 CMU-1 tiles of 448: "
                      f"relative error {error:.3g}", file=sys.stderr)
                self.assertLess(error, tolerance)

    def test_conchs_state_dict_through_the_converter(self):
        reference = randomised_conch(16, depth=2)
        state = {k: v.float() for k, v in reference.state_dict().items()}
        # tools/vit_reference.py's conch-v1.5, given the same weights, is the module above.
        twin = VisionTransformer({"preset": "conch_v15", "depth": 2})
        twin.load_state_dict({timm_parameter_name(k): v for k, v in state.items()})
        pixels = torch.randn(2, 3, TILE, TILE, dtype=torch.float64)
        with torch.no_grad():
            self.assertLess(relative_error(twin.double().eval()(pixels).numpy(), reference(pixels).numpy()), 1e-12)
        bin_path, checkpoint = self.path("pytorch_model_vision.bin"), self.path("conch.h5")
        torch.save(state, bin_path)
        converted = subprocess.run([sys.executable, os.path.join(REPO, "tools", "torch_to_tessera.py"),
                                    "--state-dict", bin_path, "--model", self.encoder(2), "--out", checkpoint],
                                   capture_output=True, text=True)
        self.assertEqual(converted.returncode, 0, converted.stderr)
        out = self.path("converted-out")
        result = self.extract(checkpoint, out)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        with h5py.File(os.path.join(out, "cmu-conch.h5"), "r") as f:
            features, coords = f["features"][...], f["coords"][...]
        error = relative_error(features.astype(np.float64), self.expected(reference, coords))
        print(f"conch-v1.5 (depth 2) from a torch.save state_dict, converted: relative error {error:.3g}",
              file=sys.stderr)
        self.assertLess(error, TOLERANCE)

    def dry_run(self, encoder):
        return planned_parameter_bytes(self, encoder, self.path("dry-" + encoder))

    def test_full_preset_plans_conchs_parameters_and_trident_names_it(self):
        count = conch_parameter_count()
        # the trunk's 303,350,784 (ViT-L/16 at 224 with layer scale), the pooler's 2,756,864, ln_contrast's 1,536
        self.assertEqual(count, 306_109_184)
        planned = self.dry_run("conch-v1.5")
        self.assertEqual(planned, 4 * count)
        self.assertEqual(self.dry_run("conch_v15"), planned)

    def test_conch_v1_pooler_and_misshapen_tensors_are_named(self):
        state = {k: v.float() for k, v in randomised_conch(3, depth=2).state_dict().items()}
        # CONCH v1's open_clip pooler: nn.MultiheadAttention's names, not v1.5's.
        state["attn_pool_contrast.attn.in_proj_bias"] = torch.zeros(3 * 768)
        del state["attn_pool_contrast.to_kv.weight"]
        state["trunk.pos_embed"] = torch.zeros(1, 785, 1024)  # a 28x28 grid: TRIDENT resamples it on load
        weights = self.path("broken-conch.safetensors")
        write_safetensors(weights, state)
        out = self.path("broken-conch-out")
        result = self.extract(weights, out)
        self.assertEqual(result.returncode, EXIT_BAD_INPUT, result.stderr[-2000:])
        self.assertIn("attn_pool_contrast.attn.in_proj_bias", result.stderr)
        self.assertIn("missing tensor 'attn_pool_contrast.to_kv.weight'", result.stderr)
        self.assertIn("'trunk.pos_embed' ('pos_embed') has shape [1,785,1024]", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "cmu-conch.h5")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
