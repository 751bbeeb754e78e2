"""Weight streaming (`extract --stream-weights auto|on|off`, issue 32): an encoder's transformer
blocks' weights kept in host memory and copied, a group of blocks at a time, into a ring of two
device buffers as each batch runs (compute/weight_stream.h).

- The features of a streamed run are bit-identical to the resident run of the same command: a small
  ViT of the encoders' kind (6 blocks with packed SwiGLU, registers and layer scale, weights from a
  .safetensors file with gammas 0.5 to 1.5, so every block counts) in fp32 forced to stream
  (`on`: 6 groups of one block through 2 slots, so each slot is reused), and kaiko-vits16 with fp16
  weights and timm's initialisation (no layer scale: every block counts) streaming by itself
  (`auto`) under a 20 MiB budget its 45 MB of weights cannot fit, one tile of a real slide
  (CMU-1-Small-Region.svs); its peak device memory within 10% of its plan (measured: equal).
- --dry-run at batch 1 with fp16 weights against lavapipe's own 2 GiB heap: h-optimus-0 and
  prov-gigapath (2.27 GB of fp16 weights) stream and fit, saying how (groups, ring slots, the bytes
  in host memory and on the device); uni2-h fits without streaming; with `--stream-weights off`
  the giant ViTs are exit 3 naming the budget.
- `--stream-weights` with anything but auto, on or off, or without --encoder, is exit 2 naming it.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np
import openslide

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_extract_vit import CMU, SMALL, dry_run_encoder, read_features, run, summary_of, write_tiff  # noqa: E402
from test_vit_timm import randomised, write_safetensors  # noqa: E402

EXIT_USAGE, EXIT_OUT_OF_MEMORY = 2, 3
LAVAPIPE_HEAP = 2 << 30
SIX_BLOCKS = {**SMALL, "depth": 6}


class WeightStreaming(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tessera-stream-")
        cls.addClassCleanup(shutil.rmtree, cls.dir)
        # Tiles of a real slide at its own 0.499 um/px: the encoders' 0.5, nothing resized.
        with openslide.OpenSlide(CMU) as slide:
            pixels = np.asarray(slide.read_region((600, 1200), 0, (448, 224)).convert("RGB"))
        cls.two_tiles, cls.one_tile = cls.path("tiles.tif"), cls.path("tile.tif")
        write_tiff(cls.two_tiles, pixels, 0.499)
        write_tiff(cls.one_tile, np.ascontiguousarray(pixels[:, :224]), 0.499)
        cls.encoder = cls.path("six-blocks.json")
        with open(cls.encoder, "w") as f:
            json.dump(SIX_BLOCKS, f)
        cls.weights = cls.path("six-blocks.safetensors")
        write_safetensors(cls.weights, {k: v.float() for k, v in randomised(SIX_BLOCKS, seed=32).state_dict().items()})

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def extract(self, out, slide, *args, code=0):
        result = run("extract", "--slides", slide, "--min-tissue", 0, "--out", self.path(out), *args)
        self.assertEqual(result.returncode, code, result.stderr[-3000:])
        self.assertNotIn("vulkan validation", result.stderr)  # silent under TESSERA_VALIDATION=1
        return result

    def features_and_model(self, out, slide, *args):
        """The features of a run, and its summary's device entry for its one model."""
        summary = summary_of(self.extract(out, slide, *args))
        features = read_features(self.path(out), os.path.splitext(os.path.basename(slide))[0])[0]
        self.assertTrue(np.isfinite(features).all())
        self.assertGreater(float(features.std()), 1e-3)
        return features, summary, summary["devices"][0]["models"][0]

    def test_forced_streaming_is_bit_identical_fp32(self):
        args = ["--encoder", self.encoder, "--model", self.weights, "--weights", "fp32", "--batch", 2]
        resident, _, resident_model = self.features_and_model("six-off", self.two_tiles, *args, "--stream-weights", "off")
        streamed, _, streamed_model = self.features_and_model("six-on", self.two_tiles, *args, "--stream-weights", "on")
        self.assertEqual(resident_model["stream_groups"], 0)
        self.assertEqual(streamed_model["stream_groups"], 6)  # a block a group: both slots reused thrice
        self.assertGreater(streamed_model["streamed_bytes"], 0)
        self.assertEqual(resident.shape, (2, 2 * SMALL["width"]))
        np.testing.assert_array_equal(streamed, resident)

    def test_automatic_streaming_under_a_small_budget_is_bit_identical_fp16(self):
        args = ["--encoder", "kaiko-vits16", "--random-weights", "--weights", "fp16", "--batch", 1]
        resident, _, resident_model = self.features_and_model("kaiko-resident", self.one_tile, *args)
        streamed, summary, streamed_model = self.features_and_model(
            "kaiko-streamed", self.one_tile, *args, "--device-memory-limit", "20MiB")
        self.assertEqual(resident_model["stream_groups"], 0)  # auto: the resident plan fits 2 GiB
        self.assertGreater(streamed_model["stream_groups"], 1)
        self.assertEqual(resident.shape, (1, 384))
        np.testing.assert_array_equal(streamed, resident)
        planned, peak = summary["planned_device_bytes"], summary["peak_device_bytes"]
        print(f"kaiko-vits16 fp16 weights streamed in {streamed_model['stream_groups']} groups "
              f"({streamed_model['streamed_bytes']} B in host memory): planned {planned} B, peak {peak} B; "
              f"resident planned {resident_model['planned_device_bytes']} B", file=sys.stderr)
        self.assertLessEqual(abs(peak - planned), 0.1 * planned)
        self.assertLessEqual(peak, 20 << 20)
        self.assertLess(planned, resident_model["planned_device_bytes"])

    def dry_run(self, encoder, *args):
        return dry_run_encoder(self.path("dry-" + encoder), encoder, *args)

    def test_giant_vits_with_16_bit_weights_fit_lavapipe_streamed(self):
        for encoder, streams in (("h-optimus-0", True), ("prov-gigapath", True), ("uni2-h", False)):
            result = self.dry_run(encoder)
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            device = summary_of(result)["devices"][0]
            if "llvmpipe" not in device["name"]:
                self.skipTest("the plans are lavapipe's (its 2 GiB heap)")
            plan = device["plan"]
            streaming = plan["streaming"]
            print(f"{encoder}: fp16 plan at batch 1 {plan['total']} B, streams {plan['streams_weights']}: "
                  f"{streaming}", file=sys.stderr)
            self.assertTrue(device["fits"])
            self.assertLess(plan["total"], LAVAPIPE_HEAP)
            self.assertEqual(plan["streams_weights"], streams)
            if streams:  # 40 blocks of 1536 wide: 2.27 GB of fp16 weights in host memory
                self.assertGreater(streaming["streamed_bytes"], 2.2e9)
                self.assertEqual(streaming["ring_slots"], 2)
                self.assertEqual(streaming["groups"] * streaming["blocks_per_group"], 40)
                self.assertEqual(plan["bytes"]["streamed weights (host)"], 0)  # imported: none of the heap
                self.assertLess(streaming["resident_weight_bytes"], 1e7)
                over = self.dry_run(encoder, "--stream-weights", "off")
                self.assertEqual(over.returncode, EXIT_OUT_OF_MEMORY, over.stderr[-2000:])
                self.assertIn("--device-memory-limit", over.stderr)

    def test_bad_flag_is_exit_2_naming_it(self):
        result = self.dry_run("kaiko-vits16", "--stream-weights", "sometimes")
        self.assertEqual(result.returncode, EXIT_USAGE)
        self.assertIn("--stream-weights", result.stderr)
        result = run("extract", "--slides", self.one_tile, "--model", "resnet18", "--random-weights", "--layer",
                     "layer3", "--stream-weights", "on", "--out", self.path("cnn"))
        self.assertEqual(result.returncode, EXIT_USAGE)
        self.assertIn("--stream-weights is for --encoder", result.stderr)
        self.assertFalse(os.path.exists(self.path("cnn")))


if __name__ == "__main__":
    unittest.main()
