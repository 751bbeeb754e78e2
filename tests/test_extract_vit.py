"""`tessera extract --encoder`: ViT patch encoders over slides, end to end (issue 26).

- A small ViT of the encoders' kind (packed SwiGLU, 4 registers, layer scale, no position
  embedding on the class token, Virchow2's output: class token joined with the patch mean;
  H-optimus-0's normalisation constants), its random weights from the plain-PyTorch timm
  reference (tools/vit_reference.py) in a .safetensors file, over the tissue tiles of
  CMU-1-Small-Region.svs (0.499 um/px: level 0, 224-pixel tiles, nothing resized): the features
  read back with h5py equal the reference's on the same tiles read by OpenSlide at the file's
  coords (tiled raw), relative error under 1e-4 in fp32 and 1e-2 in fp16 (stored fp16). Flags that
  do not fit an encoder (--layer, --size, no weights) are exit 2.
- A slide at 0.25 um/px (real pixels of CMU-1 written by tifffile as one level) is read by
  --slides at level 0 in 448-pixel tiles, live (no store) and halved: the features equal the
  reference's on Pillow's Image.BOX resize of the same pixels, and not its bilinear one (the test
  tells resamplings apart), and equal to the bit those of a store of the same tiles, raw. Tiles of another field are refused
  (exit 5). Without a pixel size in the file: exit 2 naming --mpp; with --mpp 0.25: the same
  features. --devices 0,0 and --shard 0/2 + 1/2 give the same features as one device.
- --dry-run for UNI2-h at batch 32 plans under 16 GiB, says the batch is capped on lavapipe
  (128 MiB maxStorageBufferRange), creates nothing, and is exit 3 against lavapipe's own 2 GiB.
- extract --encoder uni --random-weights writes finite 1024-d features for a real slide's tiles,
  its measured peak device memory within 10% of its plan.
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
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
from test_vit_timm import randomised, relative_error, write_safetensors  # noqa: E402

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
TESTDATA = os.path.join(os.path.dirname(REPO), "shared", "testdata", "slides")
CMU = os.path.join(TESTDATA, "CMU-1-Small-Region.svs")
EXIT_USAGE, EXIT_OUT_OF_MEMORY = 2, 3

H_OPTIMUS = {"mean": [0.707223, 0.578729, 0.703617], "std": [0.211883, 0.230117, 0.177517]}
SMALL = {"family": "vit", "image_size": 224, "patch_size": 32, "width": 48, "depth": 2, "heads": 3,
         "mlp": "swiglu", "mlp_ratio": 2.0, "class_token": True, "register_tokens": 4, "layer_scale": 1e-5,
         "position_embedding": "patches", "final_norm": "tokens", "output": "class_token_and_patch_mean",
         "preprocessing": {**H_OPTIMUS, "microns_per_pixel": 0.5}}


def run(*args, timeout=1200):
    return subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def summary_of(result):
    return json.loads(result.stdout.strip().splitlines()[-1])


def read_features(directory, name):
    with h5py.File(os.path.join(directory, name + ".h5"), "r") as f:
        return (f["features"][...], f["coords"][...], dict(f["coords"].attrs),
                json.loads(f["features"].attrs["extraction"]))


def dry_run_encoder(out, encoder, *args):
    """`extract --dry-run` of ENCODER with random weights at batch 1 in fp16; nothing is written to OUT."""
    result = run("extract", "--encoder", encoder, "--random-weights", "--batch", 1, "--dry-run", "--out", out,
                 "--precision", "fp16", *args)
    assert not os.path.exists(out), out
    return result


def write_tiff(path, pixels, mpp):
    """One tiled, uncompressed level; the pixel size as TIFF resolution (pixels per cm) or none."""
    resolution = {} if mpp is None else {"resolution": (1e4 / mpp, 1e4 / mpp), "resolutionunit": "CENTIMETER"}
    tifffile.imwrite(path, pixels, tile=(256, 256), photometric="rgb", **resolution)


def reference_features(model, tiles):
    """The reference's features of uint8 RGB tiles [N,224,224,3], normalised SMALL's way."""
    x = torch.from_numpy(np.stack(tiles)).permute(0, 3, 1, 2).double() / 255
    mean = torch.tensor(H_OPTIMUS["mean"], dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(H_OPTIMUS["std"], dtype=torch.float64).view(1, 3, 1, 1)
    with torch.no_grad():
        return model((x - mean) / std).numpy()


class EncoderExtraction(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="tessera-extract-vit-")
        cls.dir = cls.directory.name
        cls.encoder = cls.path("small-vit.json")
        with open(cls.encoder, "w") as f:
            json.dump(SMALL, f)
        cls.reference = randomised(SMALL, seed=26)
        cls.weights = cls.path("small-vit.safetensors")
        write_safetensors(cls.weights, {k: v.float() for k, v in cls.reference.state_dict().items()})
        # Real pixels at 0.25 um/px: CMU-1's level 0 (0.499 um/px) declared twice as fine.
        with openslide.OpenSlide(CMU) as slide:
            region = np.asarray(slide.read_region((600, 1200), 0, (896, 448)).convert("RGB"))
        cls.fine_pixels = region
        write_tiff(cls.path("fine.tif"), region, 0.25)
        write_tiff(cls.path("unscaled.tif"), region, None)
        write_tiff(cls.path("fine-b.tif"), np.ascontiguousarray(region[:, ::-1]), 0.25)

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def expected(self, tiles):
        return reference_features(self.reference, tiles)

    def extract(self, out, *args):
        result = run("extract", "--encoder", self.encoder, "--model", self.weights, "--out", self.path(out),
                     "--batch", 4, *args)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        return summary_of(result)

    def test_real_slide_matches_the_reference_fp32_and_fp16(self):
        store = self.path("cmu.lmdb")
        tiled = run("tile", CMU, "--out", store, "--size", 224, "--encoding", "raw", "--min-tissue", 0.5)
        self.assertEqual(tiled.returncode, 0, tiled.stderr[-3000:])
        for precision, tolerance in (("fp32", 1e-4), ("fp16", 1e-2)):
            summary = self.extract("cmu-" + precision, "--tiles", store, "--precision", precision)
            features, coords, attributes, extraction = read_features(self.path("cmu-" + precision),
                                                                     "CMU-1-Small-Region")
            self.assertEqual(features.dtype, np.float32 if precision == "fp32" else np.float16)
            self.assertEqual(features.shape, (len(coords), 2 * SMALL["width"]))
            self.assertGreater(len(coords), 10)
            self.assertEqual((attributes["patch_size"], attributes["patch_level"]), (224, 0))
            self.assertEqual(extraction["encoder"], self.encoder)
            self.assertEqual(extraction["microns_per_pixel"], 0.5)
            with openslide.OpenSlide(CMU) as slide:
                tiles = [np.asarray(slide.read_region((int(x), int(y)), 0, (224, 224)).convert("RGB"))
                         for x, y in coords]
            error = relative_error(features.astype(np.float64), self.expected(tiles))
            print(f"CMU-1-Small-Region {len(coords)} tiles {precision}: relative error {error:.3g}",
                  file=sys.stderr)
            self.assertLess(error, tolerance)
            self.assertEqual(summary["tiles"], len(coords))

    def test_fine_slide_is_read_at_level_0_and_halved(self):
        # --slides chooses the level and the tile size from the slide's pixel size...
        self.extract("fine", "--slides", self.path("fine.tif"), "--min-tissue", 0)
        _, coords, attributes, _ = read_features(self.path("fine"), "fine")
        self.assertEqual((attributes["patch_size"], attributes["patch_level"]), (448, 0))
        self.assertEqual(sorted(map(tuple, coords)), [(0, 0), (448, 0)])
        # TRIDENT's attributes: a 40x slide read for a 20x encoder, which made the features.
        self.assertEqual((attributes["level0_magnification"], attributes["target_magnification"]), (40, 20))
        self.assertEqual(attributes["patch_size_level0"], 448)
        with h5py.File(os.path.join(self.path("fine"), "fine.h5"), "r") as f:
            self.assertEqual(f["features"].attrs["encoder"], self.encoder)
        # ... reads the slide's own pixels (no store), as a store of raw tiles holds them.
        self.assertEqual(sorted(os.listdir(self.path("fine"))), ["fine.h5", "runs"])
        features, coords, _, _ = read_features(self.path("fine"), "fine")
        store = self.path("fine.lmdb")
        tiled = run("tile", self.path("fine.tif"), "--out", store, "--size", 448, "--encoding", "raw",
                    "--min-tissue", 0)
        self.assertEqual(tiled.returncode, 0, tiled.stderr[-3000:])
        self.extract("fine-raw", "--tiles", store)
        stored, stored_coords, _, _ = read_features(self.path("fine-raw"), "fine")
        self.assertTrue(np.array_equal(features, stored) and np.array_equal(coords, stored_coords))
        errors = {}
        for name, resample in {"box": Image.BOX, "bilinear": Image.BILINEAR}.items():
            tiles = [np.asarray(Image.fromarray(self.fine_pixels[y:y + 448, x:x + 448]).resize((224, 224), resample))
                     for x, y in coords]
            errors[name] = relative_error(features.astype(np.float64), self.expected(tiles))
        print(f"0.25 um/px slide, halved: relative error against Pillow's box {errors['box']:.3g}, "
              f"bilinear {errors['bilinear']:.3g}", file=sys.stderr)
        self.assertLess(errors["box"], 1e-4)
        self.assertGreater(errors["bilinear"], 1e-2)

    def test_tiles_of_another_magnification_are_refused(self):
        store = self.path("cmu-at-level-1.lmdb")
        tiled = run("tile", CMU, "--out", store, "--size", 112, "--level", 0, "--min-tissue", 0.5)
        self.assertEqual(tiled.returncode, 0, tiled.stderr[-3000:])
        result = run("extract", "--encoder", self.encoder, "--model", self.weights, "--tiles", store, "--out",
                     self.path("refused"))
        self.assertEqual(result.returncode, 5, result.stderr[-2000:])
        self.assertIn("112-pixel tiles", result.stderr)
        self.assertIn("--slides", result.stderr)

    def test_a_slide_without_its_pixel_size_needs_mpp(self):
        out = self.path("unscaled")
        result = run("extract", "--encoder", self.encoder, "--model", self.weights, "--slides",
                     self.path("unscaled.tif"), "--out", out, "--min-tissue", 0)
        self.assertEqual(result.returncode, EXIT_USAGE, result.stderr[-2000:])
        self.assertIn("--mpp", result.stderr)
        self.assertIn("unscaled.tif", result.stderr)
        self.extract("unscaled", "--slides", self.path("unscaled.tif"), "--min-tissue", 0, "--mpp", 0.25)
        self.extract("scaled", "--slides", self.path("fine.tif"), "--min-tissue", 0)
        unscaled, _, _, _ = read_features(out, "unscaled")
        scaled, _, _, _ = read_features(self.path("scaled"), "fine")
        np.testing.assert_array_equal(unscaled, scaled)

    def test_devices_and_shards_give_the_same_features(self):
        slides = ["--slides", self.path("fine.tif"), self.path("fine-b.tif"), "--min-tissue", 0]
        self.extract("one-device", *slides)
        self.extract("two-devices", *slides, "--devices", "0,0")
        for k in (0, 1):
            self.extract("shards", *slides, "--shard", f"{k}/2")
        for name in ("fine", "fine-b"):
            single, coords, _, _ = read_features(self.path("one-device"), name)
            for run_name in ("two-devices", "shards"):
                other, other_coords, _, _ = read_features(self.path(run_name), name)
                np.testing.assert_array_equal(other, single)
                np.testing.assert_array_equal(other_coords, coords)

    def test_flags_that_do_not_fit_an_encoder_are_refused(self):
        slides = ["--slides", self.path("fine.tif"), "--out", self.path("usage")]
        for extra, named in ((["--model", self.weights, "--layer", "blocks.1"], "--layer"),
                             (["--model", self.weights, "--size", 448], "--size"),
                             ([], "--random-weights"),
                             (["--model", self.weights, "--random-weights"], "--random-weights")):
            result = run("extract", "--encoder", self.encoder, *extra, *slides)
            self.assertEqual(result.returncode, EXIT_USAGE, result.stderr[-2000:])
            self.assertIn(named, result.stderr)
        self.assertFalse(os.path.exists(self.path("usage")))

    def test_uni2h_dry_run_plans_under_16_gib(self):
        out = self.path("dry")
        result = run("extract", "--encoder", "uni2-h", "--random-weights", "--batch", 32, "--dry-run",
                     "--device-memory-limit", "16GiB", "--out", out)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        plan = summary_of(result)
        device = plan["devices"][0]
        print(f"UNI2-h dry run: {json.dumps(device)}", file=sys.stderr)
        self.assertLess(device["plan_at_requested_batch"]["total"], 16 << 30)
        self.assertGreater(device["plan_at_requested_batch"]["bytes"]["parameters"], 681394176 * 4 * 0.99)
        self.assertFalse(os.path.exists(out))
        if device["batch"] < 32:  # lavapipe: one buffer at most 128 MiB
            self.assertIn("maxStorageBufferRange", device["batch_capped"]["warning"])
            self.assertLessEqual(device["batch"] * 265 * 8192 * 4, 128 << 20)
        # Against lavapipe's own 2 GiB heap UNI2-h's fp32 weights alone (2.7 GB) do not fit resident;
        # streamed (--stream-weights auto, the default) they do.
        if "llvmpipe" in device["name"]:
            args = ["extract", "--encoder", "uni2-h", "--random-weights", "--batch", 32, "--dry-run", "--out", out]
            over = run(*args, "--stream-weights", "off")
            self.assertEqual(over.returncode, EXIT_OUT_OF_MEMORY, over.stderr[-2000:])
            streamed = run(*args)
            self.assertEqual(streamed.returncode, 0, streamed.stderr[-2000:])
            self.assertTrue(summary_of(streamed)["devices"][0]["plan"]["streams_weights"])
            self.assertFalse(os.path.exists(out))

    def test_uni_random_weights_real_tiles_peak_within_plan(self):
        with openslide.OpenSlide(CMU) as slide:
            region = np.asarray(slide.read_region((600, 1200), 0, (448, 224)).convert("RGB"))
        write_tiff(self.path("uni-tiles.tif"), region, 0.499)
        out = self.path("uni")
        result = run("extract", "--encoder", "uni", "--random-weights", "--slides", self.path("uni-tiles.tif"),
                     "--min-tissue", 0, "--out", out, "--batch", 2)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        summary = summary_of(result)
        features, coords, _, extraction = read_features(out, "uni-tiles")
        self.assertEqual(features.shape, (2, 1024))
        self.assertTrue(np.isfinite(features).all())
        self.assertGreater(float(features.std()), 1e-3)
        self.assertEqual(extraction["encoder"], "uni")
        planned, peak = summary["planned_device_bytes"], summary["peak_device_bytes"]
        print(f"uni batch 2: planned {planned} B, peak {peak} B", file=sys.stderr)
        self.assertLessEqual(abs(peak - planned), 0.1 * planned)


if __name__ == "__main__":
    unittest.main()
