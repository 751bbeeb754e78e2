"""The encoder presets of issue 32 (H-optimus-1, H0-mini, kaiko.ai's ViTs, Lunit's ViT-S/8, Virchow) against
their publishers' definitions, written from source in plain PyTorch (tools/vit_reference.py, timm's
VisionTransformer), and TRIDENT's names for the encoders.

- Each preset, at its real width, heads, patch size, registers, MLP, layer scale, position rule
  and output rule but one or two blocks deep (lavapipe is slow), with random weights (layer-scale
  gammas drawn from 0.5 to 1.5, far from timm's 1e-5, so that every block counts) in a .safetensors
  file of timm's names, run by `tessera extract --encoder` over real pixels of CMU-1-Small-Region.svs
  (0.499 um/px, read at level 0, nothing resized): the features equal the reference's on the same
  tiles, normalised by the publisher's mean and std as written here from its source (not read from
  compute/vit_presets.json), relative error under 1e-4 in fp32 and under 1e-2 with --precision fp16
  (fp16 activations and weights). kaiko-vitl14 reads 224-pixel tiles
  while its position embedding is learned at 518 (37x37) and resampled as timm's dynamic_img_size.
- The full presets' plans (extract --dry-run): their parameter bytes are 4 x timm's parameter
  counts, and TRIDENT's names plan the same model as tessera's; an encoder not there (musk)
  is exit 5 listing the presets with TRIDENT's names.
- kaiko-vits16 at full depth, from a torch.save state_dict through tools/torch_to_tessera.py, likewise.
- A wrong-shaped or missing tensor of a preset's weights is exit 5 naming it, nothing written.
"""
import json
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, os.path.join(REPO, "tests"))
from test_vit_timm import randomised, relative_error, write_safetensors  # noqa: E402

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
CMU = os.path.join(os.path.dirname(REPO), "shared", "testdata", "slides", "CMU-1-Small-Region.svs")
EXIT_BAD_INPUT = 5
TOLERANCE = 1e-4
FP16_TOLERANCE = 1e-2  # --precision fp16: fp16 activations and weights, sums in fp32

# The publishers' normalisation, from their source: Bioptimus's (TRIDENT's hoptimus1, lazyslide's
# get_hoptimus_transform), kaiko's (towards_large_pathology_fms README, TRIDENT's KAIKO_MEAN/STD),
# Lunit's (kaiko-ai/eva backbones/pathology/lunit.py, quoting benchmark-ssl-pathology).
BIOPTIMUS = ((0.707223, 0.578729, 0.703617), (0.211883, 0.230117, 0.177517))
KAIKO = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
LUNIT = ((0.70322989, 0.53606487, 0.66096631), (0.21716536, 0.26081574, 0.20723464))
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # TRIDENT's virchow

# preset -> (depth of the small variant, normalisation, feature width, timm's parameter count)
PRESETS = {
    "h-optimus-1": (1, BIOPTIMUS, 1536, 1134774272),
    "h0-mini": (2, BIOPTIMUS, 1536, 85739520),
    "kaiko-vits8": (2, KAIKO, 384, 21670272),
    "kaiko-vits16": (2, KAIKO, 384, 21665664),
    "kaiko-vitb8": (2, KAIKO, 768, 85807872),
    "kaiko-vitb16": (2, KAIKO, 768, 85798656),
    "kaiko-vitl14": (1, KAIKO, 1024, 304370688),
    "lunit-vits8": (2, LUNIT, 384, 21670272),
    "virchow": (1, IMAGENET, 2560, 631229184),
}
# TRIDENT's encoder_factory names (mahmoodlab/TRIDENT trident/patch_encoder_models/load.py) that
# differ from tessera's presets.
TRIDENT = {"uni_v1": "uni", "uni_v2": "uni2-h", "hoptimus0": "h-optimus-0", "hoptimus1": "h-optimus-1",
           "gigapath": "prov-gigapath", "phikon_v2": "phikon-v2", "midnight12k": "midnight",
           "hibou_l": "hibou-l"}


def run(*args, timeout=1200):
    return subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def summary_of(result):
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_region_slide(directory, microns_per_pixel=0.499, size=(672, 224)):
    """224-pixel tiles of real H&E (three at CMU-1's own 0.499 um/px, read at level 0, not resized), as a
    tiled TIFF declared at `microns_per_pixel`, so that an encoder reading at that rate takes them
    unresized: (the pixels, the slide's path)."""
    with openslide.OpenSlide(CMU) as slide:
        region = np.asarray(slide.read_region((600, 1200), 0, size).convert("RGB"))
    path = os.path.join(directory, "cmu-region.tif")
    tifffile.imwrite(path, region, tile=(256, 256), photometric="rgb",
                     resolution=(1e4 / microns_per_pixel, 1e4 / microns_per_pixel), resolutionunit="CENTIMETER")
    return region, path


def expected_features(reference, region, normalisation, coords):
    """The reference's features of the tiles at `coords`, normalised by (mean, std), in float64."""
    tiles = np.stack([region[y:y + 224, x:x + 224] for x, y in coords])
    x = torch.from_numpy(tiles).permute(0, 3, 1, 2).double() / 255
    mean, std = (torch.tensor(v, dtype=torch.float64).view(1, 3, 1, 1) for v in normalisation)
    with torch.no_grad():
        return reference((x - mean) / std).numpy()


def planned_parameter_bytes(test, encoder, out):
    """The parameter bytes of `extract --encoder ENCODER --dry-run`'s plan at batch 2 (which writes nothing)."""
    result = run("extract", "--encoder", encoder, "--random-weights", "--batch", 2, "--dry-run",
                 "--device-memory-limit", "64GiB", "--out", out)
    test.assertEqual(result.returncode, 0, result.stderr[-2000:])
    test.assertFalse(os.path.exists(out))
    return summary_of(result)["devices"][0]["plan_at_requested_batch"]["bytes"]["parameters"]


class EncoderPresets(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="tessera-vit-presets-")
        cls.dir = cls.directory.name
        cls.region, cls.slide = write_region_slide(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def small(self, preset):
        depth = PRESETS[preset][0]
        description = {"preset": preset, "depth": depth}
        encoder = self.path(preset + ".json")
        with open(encoder, "w") as f:
            json.dump(description, f)
        return description, encoder

    def expected(self, reference, normalisation, coords):
        return expected_features(reference, self.region, normalisation, coords)

    def test_presets_match_their_publishers_definitions_on_real_tiles(self):
        for seed, (preset, (_, normalisation, features_width, _)) in enumerate(PRESETS.items()):
            with self.subTest(preset):
                description, encoder = self.small(preset)
                reference = randomised(description, seed=100 + seed)
                weights = self.path(preset + ".safetensors")
                write_safetensors(weights, {k: v.float() for k, v in reference.state_dict().items()})
                expected = None
                for precision, tolerance in (("fp32", TOLERANCE), ("fp16", FP16_TOLERANCE)):
                    out = self.path(f"{preset}-{precision}")
                    result = run("extract", "--encoder", encoder, "--model", weights, "--slides", self.slide,
                                 "--min-tissue", 0, "--out", out, "--batch", 3, "--precision", precision)
                    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
                    with h5py.File(os.path.join(out, "cmu-region.h5"), "r") as f:
                        features, coords = f["features"][...], f["coords"][...]
                        self.assertEqual((f["coords"].attrs["patch_size"], f["coords"].attrs["patch_level"]), (224, 0))
                    self.assertEqual(features.shape, (3, features_width))
                    if expected is None:
                        expected = self.expected(reference, normalisation, coords)
                        self.assertGreater(float(expected.std()), 1e-2)
                    error = relative_error(features.astype(np.float64), expected)
                    print(f"{preset} (depth {description['depth']}, {precision}) on 3 CMU-1 tiles: relative error "
                          f"{error:.3g}", file=sys.stderr)
                    self.assertLess(error, tolerance)
                os.remove(weights)

    def test_a_whole_preset_through_the_converter(self):
        # kaiko's ViT-S/16 at its full depth, as kaiko's release ships it: a torch.save state_dict
        # of timm's names, converted by tools/torch_to_tessera.py --preset, then extract --model.
        reference = randomised({"preset": "kaiko-vits16"}, seed=16)
        state = self.path("vits16.pt")
        torch.save({k: v.float() for k, v in reference.state_dict().items()}, state)
        checkpoint = self.path("vits16.h5")
        converted = subprocess.run([sys.executable, os.path.join(REPO, "tools", "torch_to_tessera.py"),
                                    "--state-dict", state, "--preset", "kaiko-vits16", "--out", checkpoint],
                                   capture_output=True, text=True)
        self.assertEqual(converted.returncode, 0, converted.stderr)
        out = self.path("vits16-out")
        result = run("extract", "--encoder", "kaiko-vits16", "--model", checkpoint, "--slides", self.slide,
                     "--min-tissue", 0, "--out", out, "--batch", 3)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        with h5py.File(os.path.join(out, "cmu-region.h5"), "r") as f:
            features, coords = f["features"][...], f["coords"][...]
        error = relative_error(features.astype(np.float64), self.expected(reference, KAIKO, coords))
        print(f"kaiko-vits16, all 12 blocks, converted: relative error {error:.3g}", file=sys.stderr)
        self.assertLess(error, TOLERANCE)

    def dry_run(self, encoder):
        return planned_parameter_bytes(self, encoder, self.path("dry-" + encoder))

    def test_full_presets_plan_timms_parameter_counts_and_trident_names_the_same(self):
        planned = {}
        for preset, (_, _, _, count) in PRESETS.items():
            planned[preset] = self.dry_run(preset)
            # fp32 parameters, and the resampled position table of kaiko-vitl14 beside them at most
            self.assertGreaterEqual(planned[preset], 4 * count, preset)
            self.assertLess(planned[preset], 4 * count * 1.01, preset)
        for trident, preset in TRIDENT.items():
            self.assertEqual(self.dry_run(trident), planned.get(preset) or self.dry_run(preset), trident)
        # An encoder tessera does not have yet: exit 5, the presets listed with TRIDENT's names.
        result = run("extract", "--encoder", "musk", "--random-weights", "--dry-run", "--out", self.path("x"))
        self.assertEqual(result.returncode, EXIT_BAD_INPUT, result.stderr[-2000:])
        for listed in ("uni2-h (uni_v2)", "h-optimus-1 (hoptimus1)", "kaiko-vitl14", "lunit-vits8", "midnight (midnight12k)"):
            self.assertIn(listed, result.stderr)

    def test_wrong_shaped_and_missing_tensors_are_named(self):
        description, encoder = self.small("h0-mini")
        state = {k: v.float() for k, v in randomised(description, seed=7).state_dict().items()}
        state["blocks.0.mlp.fc1.weight"] = torch.zeros(3072, 768)  # timm's default mlp_ratio 4
        del state["reg_token"]
        weights = self.path("broken-h0-mini.safetensors")
        write_safetensors(weights, state)
        out = self.path("broken-out")
        result = run("extract", "--encoder", encoder, "--model", weights, "--slides", self.slide, "--min-tissue", 0,
                     "--out", out)
        self.assertEqual(result.returncode, EXIT_BAD_INPUT, result.stderr[-2000:])
        self.assertIn("'blocks.0.mlp.fc1.weight' has shape [3072,768]", result.stderr)
        self.assertIn("missing tensor 'reg_token'", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "cmu-region.h5")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
