"""resnet50 converted from PyTorch: PyTorch's logits in `tessera forward`, and CLAM's
resnet50_trunc features from `tessera extract --layer layer3`.

Run by ctest as: /usr/bin/python3 tests/test_resnet50_torch.py TESSERA_BINARY

A seeded torchvision resnet50 (10 classes; batch norm statistics perturbed as in
test_resnet18_torch.py, so that eval-mode batch norm, which tessera folds into the
convolutions, is really exercised) is converted with tools/torch_to_tessera.py.
- `tessera forward` on a random normalised input [2,3,64,64] gives the logits of PyTorch
  (float64) with a relative error max|a-b| / max|b| under 1e-4 (as test_resnet18_torch.py).
- `tessera extract --layer layer3` on the 64x64 tiles of a synthetic slide writes 1024
  features per tile equal (same relative error) to CLAM's resnet50_trunc (torchvision's
  resnet50 through layer3, AdaptiveAvgPool2d(1); tools/tessera_presets.Resnet50Trunc) on the
  same tiles, read back from the tile store with python3-lmdb; with `--precision fp16`
  (fp16 activations, fp32 weights and sums, features stored as fp16) under 1e-2.
"""
import copy
import os
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(TESTS, "..", "tools"))
from data_tools import parse_value, read_store, run as run_tessera, summary, synth  # noqa: E402
from tessera_presets import Resnet50Trunc, normalise  # noqa: E402
from test_resnet18_torch import CONVERTER, check_logits_match_torch, relative_error, run, seeded_resnet  # noqa: E402

CLASSES = 10
TILE = 64
TOLERANCE = 1e-4
# fp16 activations through 23 bottleneck layers: each store rounds by at most 2^-11; the
# errors add up over the depth to some 1e-3 of the features' scale.
FP16_TOLERANCE = 1e-2
TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


class Resnet50MatchesTorch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="tessera-resnet50-")
        cls.dir = cls.directory.name
        cls.model = seeded_resnet("resnet50", seed=4321, classes=CLASSES)
        torch.save(cls.model.state_dict(), cls.path("resnet50.pt"))
        converted = run([sys.executable, CONVERTER, "--state-dict", cls.path("resnet50.pt"), "--preset", "resnet50",
                         "--out", cls.path("resnet50.h5")])
        assert converted.returncode == 0, f"converter failed:\n{converted.stderr}"

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def test_forward_logits_match_torch(self):
        # 16 bottlenecks: PyTorch's own float32 logits are 3e-5 off its float64 ones here.
        check_logits_match_torch(self, TESSERA, self.model, self.path("resnet50.h5"), self.dir, seed=98)

    def test_layer3_features_match_clam_resnet50_trunc(self):
        slide, store = self.path("slide.tiff"), self.path("tiles.lmdb")
        synth(TESSERA, slide, 640, 384, 3)
        run_tessera(TESSERA, "tile", slide, "--out", store, "--size", TILE, "--encoding", "raw",
                    "--min-tissue", "0.1")

        tiles, slides = read_store(store)
        (entry,) = slides.values()
        keys = sorted(tiles)
        self.assertGreaterEqual(len(keys), 8, "too few tissue tiles for a meaningful comparison")
        images = np.stack([np.asarray(parse_value(k, tiles[k])["image"]) for k in keys])
        with torch.no_grad():
            expected = Resnet50Trunc(copy.deepcopy(self.model)).double().eval()(normalise(images).double()).numpy()
        self.assertGreater(float(expected.std()), 1e-2, "reference features are nearly constant")

        for precision, tolerance in (("fp32", TOLERANCE), ("fp16", FP16_TOLERANCE)):
            out = self.path("features-" + precision)
            result = summary(run_tessera(TESSERA, "extract", "--model", self.path("resnet50.h5"), "--layer", "layer3",
                                         "--tiles", store, "--out", out, "--batch", "8", "--precision", precision))
            self.assertEqual(result["extraction"]["output_shape"], [1024, TILE // 16, TILE // 16], result)
            self.assertEqual(result["extraction"]["pooling"], "global_average", result)
            self.assertEqual(result["extraction"]["precision"], precision, result)
            with h5py.File(os.path.join(out, entry["name"].rsplit(".", 1)[0] + ".h5"), "r") as f:
                features = f["features"][...]
            self.assertEqual(features.shape, (len(keys), 1024))
            self.assertEqual(features.dtype, np.float16 if precision == "fp16" else np.float32)
            error = relative_error(features.astype(np.float64), expected)
            print(f"resnet50 layer3 features of {len(keys)} tiles in {precision}: tessera vs CLAM resnet50_trunc "
                  f"(PyTorch float64) relative error {error:.3g} (limit {tolerance})", file=sys.stderr)
            self.assertLess(error, tolerance)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        TESSERA = sys.argv.pop(1)
    unittest.main(verbosity=2)
