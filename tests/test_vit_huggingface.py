"""Encoders published with Hugging Face transformers' Dinov2 names (Phikon-v2, Midnight, Hibou-L), read as shipped.

The reference is Dinov2Model written from transformers' source (models/dinov2/modeling_dinov2.py) in
plain PyTorch, with query, key and value as three linears and Hugging Face's parameter names, so that
its state_dict is the file a publisher ships; tessera joins query, key and value into timm's qkv when
it reads the file. Random weights (layer-scale lambdas drawn from 0.5 to 1.5), one block deep at each
model's real width, heads, patch size and MLP, over real pixels of CMU-1-Small-Region.svs read at level
0, within 1e-4 relative error in fp32 and 1e-2 with --precision fp16 (fp16 activations and weights):
- Phikon-v2: the class token after the final LayerNorm (last_hidden_state[:, 0, :]);
- Midnight (ViT-g/14, the SwiGLU MLP's weights_in and weights_out): its position grid stored at
  518 pixels (37x37) and interpolated to the 16x16 of 224-pixel tiles as interpolate_pos_encoding
  does (plain bicubic), the class token joined with the patch tokens' mean (kaiko's card), 3072-d;
- Hibou-L (Dinov2WithRegisters, transformers' models/dinov2_with_registers: 4 register tokens inserted
  after the position embedding is added to the class token and the patches, the SwiGLU MLP), the class
  token after the final LayerNorm (TRIDENT's pooler_output), 1024-d.
The file's mask token (pre-training only) is accepted and unused; a missing key or a misshapen value is
exit 5 naming it.
"""
import math
import os
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_vit_presets import (EXIT_BAD_INPUT, FP16_TOLERANCE, IMAGENET, KAIKO, TOLERANCE,  # noqa: E402
                              expected_features, planned_parameter_bytes, run, write_region_slide)
from test_vit_timm import randomise_parameters, relative_error, write_safetensors  # noqa: E402

HIBOU = ((0.7068, 0.5755, 0.722), (0.195, 0.2316, 0.1816))  # TRIDENT's get_constants('hibou')


class Dinov2Layer(nn.Module):
    """Dinov2Layer: norm1, self-attention (query, key, value; output.dense), layer_scale1, residual;
    norm2, GELU MLP (fc1, fc2) or SwiGLU (weights_in, weights_out), layer_scale2, residual."""

    def __init__(self, width, heads, hidden, swiglu):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attention = nn.Module()
        self.attention.attention = nn.Module()
        for part in ("query", "key", "value"):
            setattr(self.attention.attention, part, nn.Linear(width, width))
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(width, width)
        self.layer_scale1 = nn.Module()
        self.layer_scale1.lambda1 = nn.Parameter(torch.ones(width))
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Module()
        self.swiglu = swiglu
        if swiglu:  # Dinov2SwiGLUFFN: hidden (int(4 * width * 2 / 3) + 7) // 8 * 8, both halves from weights_in
            hidden = (int(hidden * 2 / 3) + 7) // 8 * 8
            self.mlp.weights_in = nn.Linear(width, 2 * hidden)
            self.mlp.weights_out = nn.Linear(hidden, width)
        else:
            self.mlp.fc1 = nn.Linear(width, hidden)
            self.mlp.fc2 = nn.Linear(hidden, width)
        self.layer_scale2 = nn.Module()
        self.layer_scale2.lambda1 = nn.Parameter(torch.ones(width))

    def self_attention(self, x):
        n, tokens, width = x.shape
        attention = self.attention.attention

        def split(linear):
            return linear(x).view(n, tokens, self.heads, width // self.heads).transpose(1, 2)

        query, key, value = split(attention.query), split(attention.key), split(attention.value)
        weights = torch.softmax(query @ key.transpose(-1, -2) / math.sqrt(width // self.heads), dim=-1)
        context = (weights @ value).transpose(1, 2).reshape(n, tokens, width)
        return self.attention.output.dense(context)

    def feed_forward(self, x):
        if self.swiglu:
            x1, x2 = self.mlp.weights_in(x).chunk(2, dim=-1)
            return self.mlp.weights_out(nn.functional.silu(x1) * x2)
        return self.mlp.fc2(nn.functional.gelu(self.mlp.fc1(x)))

    def forward(self, x):
        x = x + self.self_attention(self.norm1(x)) * self.layer_scale1.lambda1
        return x + self.feed_forward(self.norm2(x)) * self.layer_scale2.lambda1


class Dinov2Model(nn.Module):
    """Dinov2Model: embeddings (cls_token, mask_token, position_embeddings over the class token and
    the patches of an image_size input, patch_embeddings.projection), the encoder's layers, the final
    layernorm; returns last_hidden_state's class token, or it joined with the patch tokens' mean.
    With registers, Dinov2WithRegistersModel: register_tokens inserted after the class token once
    the position embedding is added."""

    def __init__(self, width, depth, heads, patch, image_size=224, swiglu=False, output="class_token", registers=0):
        super().__init__()
        self.patch, self.output, self.registers = patch, output, registers
        grid = image_size // patch
        self.embeddings = nn.Module()
        self.embeddings.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.embeddings.mask_token = nn.Parameter(torch.zeros(1, width))
        if registers:
            self.embeddings.register_tokens = nn.Parameter(torch.zeros(1, registers, width))
        self.embeddings.position_embeddings = nn.Parameter(torch.zeros(1, grid * grid + 1, width))
        self.embeddings.patch_embeddings = nn.Module()
        self.embeddings.patch_embeddings.projection = nn.Conv2d(3, width, patch, patch)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([Dinov2Layer(width, heads, 4 * width, swiglu) for _ in range(depth)])
        self.layernorm = nn.LayerNorm(width, eps=1e-6)

    def interpolate_pos_encoding(self, height, width):
        """Dinov2Embeddings.interpolate_pos_encoding: the patch rows resampled, in float32, by
        F.interpolate(size=(height // patch, width // patch), mode="bicubic", align_corners=False)."""
        table = self.embeddings.position_embeddings
        stored = int((table.shape[1] - 1) ** 0.5)
        new = (height // self.patch, width // self.patch)
        if new == (stored, stored):
            return table
        grid = table[:, 1:].reshape(1, stored, stored, -1).permute(0, 3, 1, 2)
        grid = nn.functional.interpolate(grid.to(torch.float32), size=new, mode="bicubic", align_corners=False)
        grid = grid.to(table.dtype).permute(0, 2, 3, 1).reshape(1, -1, table.shape[-1])
        return torch.cat([table[:, :1], grid], dim=1)

    def forward(self, pixels):
        embeddings = self.embeddings
        x = embeddings.patch_embeddings.projection(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([embeddings.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.interpolate_pos_encoding(*pixels.shape[-2:])
        if self.registers:
            x = torch.cat([x[:, :1], embeddings.register_tokens.expand(x.shape[0], -1, -1), x[:, 1:]], dim=1)
        for layer in self.encoder.layer:
            x = layer(x)
        x = self.layernorm(x)
        if self.output == "class_token":
            return x[:, 0, :]
        return torch.cat([x[:, 0, :], x[:, 1 + self.registers:, :].mean(dim=1)], dim=-1)


def randomised_dinov2(seed, **shape):
    torch.manual_seed(seed)
    return randomise_parameters(Dinov2Model(**shape))


class HuggingFaceDinov2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="tessera-vit-huggingface-")
        cls.region, cls.slide = write_region_slide(cls.directory.name)

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def path(self, name):
        return os.path.join(self.directory.name, name)

    def encoder(self, preset):
        encoder = self.path(preset + ".json")
        with open(encoder, "w") as f:
            f.write('{"preset": "%s", "depth": 1}' % preset)
        return encoder

    def extract(self, preset, weights, out, precision="fp32"):
        return run("extract", "--encoder", self.encoder(preset), "--model", weights, "--slides", self.slide,
                   "--min-tissue", 0, "--out", out, "--batch", 3, "--precision", precision)

    def expect_matches(self, preset, reference, normalisation, features_width):
        weights = self.path(preset + ".safetensors")
        write_safetensors(weights, {k: v.float() for k, v in reference.state_dict().items()})
        expected = None
        for precision, tolerance in (("fp32", TOLERANCE), ("fp16", FP16_TOLERANCE)):
            out = self.path(f"{preset}-{precision}")
            result = self.extract(preset, weights, out, precision)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])
            with h5py.File(os.path.join(out, "cmu-region.h5"), "r") as f:
                features, coords = f["features"][...], f["coords"][...]
            self.assertEqual(features.shape, (3, features_width))
            if expected is None:
                expected = expected_features(reference, self.region, normalisation, coords)
                self.assertGreater(float(expected.std()), 1e-2)
            error = relative_error(features.astype(np.float64), expected)
            print(f"{preset} (depth 1, Hugging Face names, {precision}) on 3 CMU-1 tiles: relative error {error:.3g}",
                  file=sys.stderr)
            self.assertLess(error, tolerance)
        os.remove(weights)

    def test_phikon_v2_from_hugging_face_names_matches_dinov2(self):
        # TRIDENT's name for it, as a TRIDENT user writes it.
        self.expect_matches("phikon_v2", randomised_dinov2(32, width=1024, depth=1, heads=16, patch=16), IMAGENET, 1024)

    def test_midnight_from_hugging_face_names_matches_dinov2(self):
        reference = randomised_dinov2(12, width=1536, depth=1, heads=24, patch=14, image_size=518, swiglu=True,
                                      output="class_token_and_patch_mean")
        self.expect_matches("midnight", reference, KAIKO, 3072)

    def test_hibou_l_from_hugging_face_names_matches_dinov2_with_registers(self):
        reference = randomised_dinov2(7, width=1024, depth=1, heads=16, patch=14, swiglu=True, registers=4)
        self.assertEqual(reference.encoder.layer[0].mlp.weights_out.in_features, 2736)  # Hibou-L's SwiGLU
        self.expect_matches("hibou_l", reference, HIBOU, 1024)
        # The whole preset plans the parameters of Hibou-L's 24 layers, fp32 (the mask token unread).
        def count(depth):
            model = Dinov2Model(width=1024, depth=depth, heads=16, patch=14, swiglu=True, registers=4)
            return sum(value.numel() for name, value in model.named_parameters() if name != "embeddings.mask_token")
        one, two = count(1), count(2)
        planned, parameters = planned_parameter_bytes(self, "hibou-l", self.path("dry-hibou-l")), one + 23 * (two - one)
        self.assertGreaterEqual(planned, 4 * parameters)
        self.assertLess(planned, 4 * parameters * 1.0001)  # 3 kB more in the plan; test_vit_presets allows 1%

    def test_a_missing_key_and_a_misshapen_value_are_named(self):
        state = {k: v.float() for k, v in randomised_dinov2(3, width=1024, depth=1, heads=16, patch=16)
                 .state_dict().items()}
        del state["encoder.layer.0.attention.attention.key.weight"]
        state["encoder.layer.0.attention.attention.value.bias"] = torch.zeros(1000)
        weights = self.path("broken-phikon.safetensors")
        write_safetensors(weights, state)
        out = self.path("broken-phikon-out")
        result = self.extract("phikon-v2", weights, out)
        self.assertEqual(result.returncode, EXIT_BAD_INPUT, result.stderr[-2000:])
        self.assertIn("'blocks.0.attn.qkv.weight' lacks one of its 3 pieces", result.stderr)
        self.assertIn("'encoder.layer.0.attention.attention.value.bias' ('blocks.0.attn.qkv.bias') has shape [1000]",
                      result.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "cmu-region.h5")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
