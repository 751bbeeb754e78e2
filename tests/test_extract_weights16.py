"""`--weights fp16|bf16|fp32`: an encoder's large weights (linear and convolution weights, the
position embedding) stored on the device in fp16, converted once as they load (issue 32).

- A small ViT of the encoders' kind (test_extract_vit's: packed SwiGLU, registers, layer scale,
  Virchow2's output) with random weights of a size that matters (gammas 0.5 to 1.5, so every
  block counts), written as a BF16 .safetensors file (UNI2-h ships BF16): extract reads it as it
  comes and, with --weights fp16 and fp32 alike, gives the plain-PyTorch reference's features on
  the same bf16 weights (float64), relative error under 1e-4 (a bf16 value is an fp16 one within
  fp16's range: converting it loses nothing that matters). From F32 weights, --weights fp16 stays
  within 1e-2 of the reference on the unrounded weights, and the feature file says it
  (`weight_precision`).
- `extract --encoder virchow2 --random-weights --precision fp16 --weights fp16` on one tile of a
  real slide (CMU-1-Small-Region.svs), batch 1: features within 1e-2 of the same run with
  --weights fp32 (which needs a 3 GiB budget), the peak device memory within 10% of its plan
  (measured: equal), under lavapipe's 2 GiB. timm's initialisation makes the layer-scale gammas
  1e-5, so this compares little beyond the patch and position embeddings: the small ViT's runs
  above check the fp16 weights of every block.
- --dry-run plans of uni2-h, virchow2, h-optimus-0 and prov-gigapath at batch 1 with fp16
  weights: parameters within 0.1% of 2 bytes a large weight and 4 a small one, counted here from
  the presets as timm defines them; uni2-h and virchow2 fit lavapipe's 2 GiB heap. h-optimus-0
  and prov-gigapath (1.13 billion weights: 2.1 GiB in 16 bits) cannot fit 2 GiB whatever the
  activations: their plans fit 2.5 GiB, and against 2 GiB they are exit 3 naming the budget with
  `--stream-weights off` (streamed, they fit: test_extract_stream.py).
- A NaN in a weight, and (with fp16 weights) one past 65504, is exit 5 naming the tensor; nothing
  is written to --out. Weights whose products pass 65504 run in fp32 activations (fp16 weights)
  and, in fp16 activations, are exit 5 naming the tile and --precision fp32: no infinity written.
- `forward --weights fp16|fp32` gives the reference's outputs (1e-2, 1e-4). --weights bf16 is
  exit 2 naming the flag and what runs instead; --weights without --encoder (a CNN) is exit 2.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

import h5py
import numpy as np
import openslide
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_extract_vit import (CMU, SMALL, dry_run_encoder, read_features, reference_features, run,  # noqa: E402
                              summary_of, write_tiff)
from test_vit_timm import randomised, relative_error, write_safetensors  # noqa: E402

EXIT_USAGE, EXIT_OUT_OF_MEMORY, EXIT_BAD_INPUT = 2, 3, 5
LAVAPIPE_HEAP = 2 << 30
PRESETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compute", "vit_presets.json")


def weight_counts(preset):
    """(large, small) weights of a preset, from timm's VisionTransformer with num_classes 0:
    large the linear and patch-embedding weights and the position embedding (stored in
    --weights' type), small the biases, norms, layer-scale gammas and tokens (fp32)."""
    w, patch = preset["width"], preset["patch_size"]
    grid = preset["image_size"] // patch
    hidden = int(w * preset["mlp_ratio"])  # timm's int(dim * mlp_ratio); the packed SwiGLU halves it
    fc2_in = hidden // 2 if preset["mlp"] == "swiglu" else hidden
    prefix = int(preset["class_token"]) + preset["register_tokens"]
    covered = prefix if preset["position_embedding"] == "tokens" else 0
    large = 3 * patch * patch * w + (covered + grid * grid) * w
    small = w + prefix * w + 2 * w  # patch_embed bias, tokens, final norm
    large += preset["depth"] * (3 * w * w + w * w + hidden * w + fc2_in * w)
    small += preset["depth"] * (2 * w + 3 * w + w + w + 2 * w + hidden + w + w)  # norms, biases, gammas
    return large, small


class SixteenBitWeights(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tessera-weights16-")
        cls.addClassCleanup(shutil.rmtree, cls.dir)
        cls.encoder = cls.path("small-vit.json")
        with open(cls.encoder, "w") as f:
            f.write(json.dumps(SMALL))
        # Two tiles of a real slide at its own 0.499 um/px: the encoders' 0.5, nothing resized.
        with openslide.OpenSlide(CMU) as slide:
            cls.pixels = np.asarray(slide.read_region((600, 1200), 0, (448, 224)).convert("RGB"))
        cls.slide = cls.path("tiles.tif")
        write_tiff(cls.slide, cls.pixels, 0.499)
        cls.one_tile = cls.path("tile.tif")  # for the giant ViT: a ViT-H/14 tile is 8 s on lavapipe
        write_tiff(cls.one_tile, np.ascontiguousarray(cls.pixels[:, :224]), 0.499)
        cls.reference = randomised(SMALL, seed=32)
        cls.state = {k: v.float() for k, v in cls.reference.state_dict().items()}

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def expected(self, model, coords):
        return reference_features(model, [self.pixels[y:y + 224, x:x + 224] for x, y in coords])

    def extract(self, out, *args, code=0, slide=None):
        result = run("extract", "--slides", slide or self.slide, "--min-tissue", 0, "--out", self.path(out), *args)
        self.assertEqual(result.returncode, code, result.stderr[-3000:])
        self.assertNotIn("vulkan validation", result.stderr)  # silent under TESSERA_VALIDATION=1
        return result

    def test_bf16_file_is_read_as_it_comes_and_run(self):
        weights = self.path("small-bf16.safetensors")
        write_safetensors(weights, self.state, "BF16")
        rounded = randomised(SMALL, seed=32)
        with torch.no_grad():  # the reference on the weights as the file rounds them
            for value in rounded.parameters():
                value.copy_(value.float().to(torch.bfloat16).double())
        for stored in ("fp16", "fp32"):
            out = "bf16-as-" + stored
            self.extract(out, "--encoder", self.encoder, "--model", weights, "--weights", stored)
            features, coords, _, extraction = read_features(self.path(out), "tiles")
            self.assertEqual(features.shape, (2, 2 * SMALL["width"]))
            error = relative_error(features.astype(np.float64), self.expected(rounded, coords))
            print(f"BF16 file, --weights {stored}: relative error {error:.3g}", file=sys.stderr)
            self.assertLess(error, 1e-4)
            self.assertEqual(extraction.get("weight_precision", "fp32"), stored)

    def test_fp16_weights_from_f32_file_within_1e_2(self):
        weights = self.path("small-f32.safetensors")
        write_safetensors(weights, self.state, "F32")
        self.extract("f32-as-fp16", "--encoder", self.encoder, "--model", weights, "--weights", "fp16")
        features, coords, _, extraction = read_features(self.path("f32-as-fp16"), "tiles")
        self.assertEqual(features.dtype, np.float32)  # --precision fp32: only the weights are 16-bit
        self.assertEqual(extraction["weight_precision"], "fp16")
        error = relative_error(features.astype(np.float64), self.expected(self.reference, coords))
        print(f"F32 file, --weights fp16: relative error {error:.3g}", file=sys.stderr)
        self.assertLess(error, 1e-2)
        self.assertGreater(error, 1e-7)  # the weights were rounded: fp16 did run

    def test_virchow2_fp16_weights_end_to_end(self):
        runs = {}
        for stored in ("fp16", "fp32"):
            out = "virchow2-" + stored
            args = ["--encoder", "virchow2", "--random-weights", "--precision", "fp16", "--batch", 1,
                    "--weights", stored]
            if stored == "fp32":  # 2.5 GB of fp32 weights: past lavapipe's 2 GiB heap
                args += ["--device-memory-limit", "3GiB"]
            summary = summary_of(self.extract(out, *args, slide=self.one_tile))
            features, _, _, extraction = read_features(self.path(out), "tile")
            self.assertEqual(features.shape, (1, 2560))
            self.assertTrue(np.isfinite(features).all())
            self.assertGreater(float(features.astype(np.float64).std()), 1e-3)
            runs[stored] = (features.astype(np.float64), summary, extraction)
        error = relative_error(runs["fp16"][0], runs["fp32"][0])
        summary = runs["fp16"][1]
        planned, peak = summary["planned_device_bytes"], summary["peak_device_bytes"]
        print(f"virchow2 batch 1, fp16 weights: relative error {error:.3g} against fp32 weights; planned {planned} B, "
              f"peak {peak} B (fp32 weights: planned {runs['fp32'][1]['planned_device_bytes']} B)", file=sys.stderr)
        self.assertLess(error, 1e-2)
        self.assertLessEqual(abs(peak - planned), 0.1 * planned)
        self.assertLess(peak, LAVAPIPE_HEAP)
        self.assertEqual(runs["fp16"][2]["weight_precision"], "fp16")
        self.assertNotIn("weight_precision", runs["fp32"][2])

    def dry_run(self, encoder, *args):
        return dry_run_encoder(self.path("dry-" + encoder), encoder, *args)

    def test_plans_count_16_bit_weights(self):
        with open(PRESETS) as f:
            presets = json.load(f)
        for encoder in ("uni2-h", "virchow2", "h-optimus-0", "prov-gigapath"):
            large, small = weight_counts(presets[encoder])
            result = self.dry_run(encoder, "--device-memory-limit", "3GiB")
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            plan = summary_of(result)
            self.assertEqual(plan["weights"], "fp16")
            device = plan["devices"][0]
            parameters, total = device["plan"]["bytes"]["parameters"], device["plan"]["total"]
            print(f"{encoder}: {large + small} weights ({small} fp32); fp16 plan at batch 1: parameters "
                  f"{parameters} B, total {total} B ({total / (1 << 30):.2f} GiB)", file=sys.stderr)
            expected = 2 * large + 4 * small
            self.assertLess(abs(parameters - expected), 1e-3 * expected)
            if 2 * large < LAVAPIPE_HEAP:  # uni2-h, virchow2
                self.assertLess(total, LAVAPIPE_HEAP)
                if "llvmpipe" in device["name"]:  # against lavapipe's own heap
                    self.assertEqual(self.dry_run(encoder).returncode, 0)
            else:  # h-optimus-0, prov-gigapath: 1.13 billion weights, 2.1 GiB in 16 bits alone
                self.assertLess(total, 2.5 * (1 << 30))
                if "llvmpipe" in device["name"]:  # resident (streamed, they fit: test_extract_stream)
                    over = self.dry_run(encoder, "--stream-weights", "off")
                    self.assertEqual(over.returncode, EXIT_OUT_OF_MEMORY, over.stderr[-2000:])
                    self.assertIn("--device-memory-limit", over.stderr)

    def test_bad_weights_are_named_and_nothing_is_written(self):
        name = "blocks.1.mlp.fc2.weight"
        for value, stored, shown in ((float("nan"), "fp32", "NaN"), (7e4, "fp16", "65504")):
            state = dict(self.state)
            state[name] = state[name].clone()
            state[name][3, 5] = value
            weights = self.path(f"bad-{stored}.safetensors")
            write_safetensors(weights, state, "F32")
            out = "bad-" + stored
            result = self.extract(out, "--encoder", self.encoder, "--model", weights, "--weights", stored,
                                  code=EXIT_BAD_INPUT)
            self.assertIn(f"tensor '{name}'", result.stderr)
            self.assertIn(shown, result.stderr)
            self.assertIn(f"index {3 * state[name].shape[1] + 5}", result.stderr)
            written = [f for _, _, files in os.walk(self.path(out)) for f in files if ".h5" in f]
            self.assertEqual(written, [])
        # The value past fp16 is a weight fp32 holds: refused only where it would be an infinity.
        self.extract("big-as-fp32", "--encoder", self.encoder, "--model", self.path("bad-fp16.safetensors"),
                     "--weights", "fp32")

    def test_fp16_activations_that_overflow_write_no_infinity(self):
        # fc2's weights (every one within fp16's range) make its output pass 65504: finite in fp32,
        # infinite in fp16 activations, whatever type the weights are stored in.
        state = dict(self.state)
        state["blocks.1.mlp.fc2.weight"] = state["blocks.1.mlp.fc2.weight"] * 3e4
        self.assertLess(float(state["blocks.1.mlp.fc2.weight"].abs().max()), 65504)
        weights = self.path("loud.safetensors")
        write_safetensors(weights, state, "F32")
        self.extract("loud-fp32", "--encoder", self.encoder, "--model", weights, "--weights", "fp16")
        features, _, _, _ = read_features(self.path("loud-fp32"), "tiles")
        self.assertTrue(np.isfinite(features).all())
        result = self.extract("loud-fp16", "--encoder", self.encoder, "--model", weights, "--precision", "fp16",
                              code=EXIT_BAD_INPUT)
        self.assertIn("tiles: tile 0", result.stderr)
        self.assertIn("extract it with --precision fp32", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.path("loud-fp16"), "tiles.h5")))
        # The run reports name the weights' type each run used, given (--weights fp16) or chosen
        # (fp16, --precision fp16's default).
        for out in ("loud-fp32", "loud-fp16"):
            runs = os.path.join(self.path(out), "runs")
            (report,) = [name for name in os.listdir(runs) if name.endswith(".json")]
            with open(os.path.join(runs, report)) as f:
                self.assertEqual(json.load(f)["settings"]["--weights"], "fp16", out)

    def test_forward_with_fp16_weights(self):
        weights = self.path("forward-f32.safetensors")
        write_safetensors(weights, self.state, "F32")
        images = torch.randn((2, 3, 224, 224), generator=torch.Generator().manual_seed(32))
        inputs = self.path("images.h5")
        with h5py.File(inputs, "w") as f:
            f.create_dataset("x", data=images.numpy())
        with torch.no_grad():
            expected = self.reference(images.double()).numpy()
        for stored, limit in (("fp16", 1e-2), ("fp32", 1e-4)):
            outputs = self.path(f"logits-{stored}.h5")
            result = run("forward", "--encoder", self.encoder, "--model", weights, "--input", inputs, "--output",
                         outputs, "--weights", stored)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])
            self.assertEqual(summary_of(result)["weights"], stored)
            with h5py.File(outputs, "r") as f:
                error = relative_error(f["logits"][...].astype(np.float64), expected)
            print(f"forward --weights {stored}: relative error {error:.3g}", file=sys.stderr)
            self.assertLess(error, limit)
        refused = run("forward", "--model", "resnet18", "--random-weights", "--input", inputs, "--output",
                      self.path("cnn.h5"), "--weights", "fp16")
        self.assertEqual(refused.returncode, EXIT_USAGE, refused.stderr[-2000:])
        self.assertIn("--weights is for --encoder", refused.stderr)

    def test_flags(self):
        result = self.extract("bf16", "--encoder", self.encoder, "--random-weights", "--weights", "bf16",
                              code=EXIT_USAGE)
        self.assertIn("--weights bf16", result.stderr)
        self.assertIn("--weights fp16", result.stderr)
        result = self.extract("cnn", "--model", "resnet18", "--random-weights", "--layer", "layer1", "--weights",
                              "fp16", code=EXIT_USAGE)
        self.assertIn("--weights is for --encoder", result.stderr)
        self.assertFalse(os.path.exists(self.path("bf16")) or os.path.exists(self.path("cnn")))


if __name__ == "__main__":
    unittest.main()
