"""CTransPath (the `ctranspath` preset, TRIDENT's name as it is) against its definition written from
source in plain PyTorch (tools/swin_reference.py: Xiyue-Wang/TransPath ctran.py's ConvStem and timm
0.5.4's swin_transformer.py, as CTransPath's fork of timm builds swin_tiny_patch4_window7_224;
timm is not installed here), random weights, on real pixels of CMU-1-Small-Region.svs declared at
the preset's 1.1429 um/px so that tessera reads them unresized.

- The whole preset (ConvStem, 12 Swin blocks over 56, 28, 14 and 7-token grids with shifted windows
  and their masks, three patch mergings, the final norm and the mean: 768-d) with random weights in
  a .safetensors file of CTransPath's own names, holding its derived buffers too
  (relative_position_index, attn_mask, num_batches_tracked), which tessera skips: relative error
  under 1e-4 in fp32, under 1e-2 with --precision fp16 (fp16 weights and activations).
- CTransPath's checkpoint as it ships (torch.save({'model': state_dict})) through
  tools/torch_to_tessera.py, likewise.
- The plan of the full preset holds CTransPath's 27,520,038 parameters (fp32) and BatchNorm's state.
- A misshapen or missing tensor, and a NaN in a weight, is exit 5 naming it, nothing written.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, os.path.join(REPO, "tests"))
from swin_reference import SwinTransformer, derived_buffer  # noqa: E402
from test_vit_presets import EXIT_BAD_INPUT, IMAGENET, TOLERANCE, expected_features, run, write_region_slide  # noqa: E402
from test_vit_timm import randomise_parameters, relative_error, write_safetensors  # noqa: E402

# TRIDENT's 256-pixel patches at 10x (1.0 um/px) resized to 224: the same 256 um field.
MICRONS_PER_PIXEL = 256 / 224
# CTransPath's parameters, counted from tools/swin_reference.py's module (its paper: 28M).
PARAMETERS = 27_520_038
# BatchNorm's running means and variances of the stem (12 and 24 channels): state beside the parameters.
STEM_STATE = 2 * (12 + 24)


def randomised_ctranspath(seed):
    """CTransPath with every parameter and BatchNorm statistic random, of a size that matters, float64."""
    torch.manual_seed(seed)
    model = randomise_parameters(SwinTransformer({"preset": "ctranspath"}))
    with torch.no_grad():
        for name, value in model.named_buffers():
            if name.endswith("running_mean"):
                value.normal_(0.0, 0.2)
            elif name.endswith("running_var"):
                value.uniform_(0.5, 1.5)
        for name, value in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                value.normal_(0.0, 1.0)  # biases of a few units, as trained tables have
    return model


def shipped_state(model):
    """The state_dict as CTransPath's checkpoint holds it: float32 tensors and the derived buffers."""
    return {k: (v.float() if v.is_floating_point() else v) for k, v in model.state_dict().items()}


class CTransPath(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="tessera-ctranspath-")
        cls.region, cls.slide = write_region_slide(cls.directory.name, MICRONS_PER_PIXEL, (448, 448))
        cls.reference = randomised_ctranspath(32)
        cls.expected = {}  # coords' bytes -> the reference's features (float64 Swin-T: seconds per call)

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def path(self, name):
        return os.path.join(self.directory.name, name)

    def extract(self, weights, out, *flags):
        return run("extract", "--encoder", "ctranspath", "--model", weights, "--slides", self.slide,
                   "--min-tissue", 0, "--out", out, "--batch", 2, *flags)

    def features_error(self, out):
        with h5py.File(os.path.join(out, "cmu-region.h5"), "r") as f:
            features, coords = f["features"][...], f["coords"][...]
            self.assertEqual((f["coords"].attrs["patch_size"], f["coords"].attrs["patch_level"]), (224, 0))
        self.assertEqual(features.shape, (4, 768))
        key = coords.tobytes()
        if key not in self.expected:
            self.expected[key] = expected_features(self.reference, self.region, IMAGENET, coords)
        expected = self.expected[key]
        self.assertGreater(float(expected.std()), 1e-2)
        return relative_error(features.astype(np.float64), expected)

    def matches_its_definition(self, precision, tolerance):
        weights = self.path("ctranspath.safetensors")
        if not os.path.exists(weights):
            state = shipped_state(self.reference)
            self.assertTrue(any(derived_buffer(k) for k in state))
            write_safetensors(weights, state)
        out = self.path("out-" + precision)
        result = self.extract(weights, out, "--precision", precision)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertNotIn("vulkan validation", result.stderr.lower())
        error = self.features_error(out)
        print(f"ctranspath (full depth, {precision}) on 4 CMU-1 tiles: relative error {error:.3g}", file=sys.stderr)
        self.assertLess(error, tolerance)

    def test_ctranspath_with_its_names_matches_its_definition_in_fp32(self):
        self.matches_its_definition("fp32", TOLERANCE)

    def test_ctranspath_with_its_names_matches_its_definition_in_fp16(self):
        self.matches_its_definition("fp16", 1e-2)

    def test_ctranspaths_checkpoint_through_the_converter(self):
        shipped, checkpoint = self.path("ctranspath.pth"), self.path("ctranspath.h5")
        torch.save({"model": shipped_state(self.reference)}, shipped)
        converted = subprocess.run([sys.executable, os.path.join(REPO, "tools", "torch_to_tessera.py"),
                                    "--state-dict", shipped, "--preset", "ctranspath", "--out", checkpoint],
                                   capture_output=True, text=True)
        self.assertEqual(converted.returncode, 0, converted.stderr)
        out = self.path("converted-out")
        result = self.extract(checkpoint, out)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        error = self.features_error(out)
        print(f"ctranspath from its torch.save checkpoint, converted: relative error {error:.3g}", file=sys.stderr)
        self.assertLess(error, TOLERANCE)

    def test_plan_holds_ctranspaths_parameters(self):
        self.assertEqual(sum(p.numel() for p in SwinTransformer({"preset": "ctranspath"}).parameters()), PARAMETERS)
        out = self.path("dry")
        result = run("extract", "--encoder", "ctranspath", "--random-weights", "--batch", 2, "--dry-run",
                     "--out", out)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertFalse(os.path.exists(out))
        planned = json.loads(result.stdout.strip().splitlines()[-1])["devices"][0]["plan_at_requested_batch"]
        # fp32, each buffer rounded up to the allocator's alignment (the bias tables are 169 x heads)
        self.assertGreaterEqual(planned["bytes"]["parameters"], 4 * (PARAMETERS + STEM_STATE))
        self.assertLess(planned["bytes"]["parameters"], 4 * (PARAMETERS + STEM_STATE) * 1.001)

    def test_misshapen_and_missing_tensors_are_named(self):
        state = shipped_state(self.reference)
        state["layers.1.blocks.1.attn.relative_position_bias_table"] = torch.zeros(169, 5)  # 6 heads
        del state["layers.2.downsample.reduction.weight"]
        weights = self.path("broken.safetensors")
        write_safetensors(weights, state)
        out = self.path("broken-out")
        result = self.extract(weights, out)
        self.assertEqual(result.returncode, EXIT_BAD_INPUT, result.stderr[-2000:])
        self.assertIn("'layers.1.blocks.1.attn.relative_position_bias_table' has shape [169,5]", result.stderr)
        self.assertIn("missing tensor 'layers.2.downsample.reduction.weight'", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "cmu-region.h5")))
        # A NaN in the stem's BatchNorm statistics: named with its index.
        state = shipped_state(self.reference)
        state["patch_embed.proj.4.running_var"][7] = float("nan")
        write_safetensors(weights, state)
        result = self.extract(weights, out)
        self.assertEqual(result.returncode, EXIT_BAD_INPUT, result.stderr[-2000:])
        self.assertIn("patch_embed.proj.4.running_var", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "cmu-region.h5")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
