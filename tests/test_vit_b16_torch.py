"""torchvision's vit_b_16, randomly initialised and converted with tools/torch_to_tessera.py
(torchvision's parameter names, renamed to timm's), gives torchvision's logits in
`tessera forward` on tiles of a real slide (CMU-1-Small-Region.svs, ../shared/testdata, read
with python3-openslide): relative error max|a-b| / max|b| under 1e-4 in fp32 and under 1e-2
in fp16, against torchvision in float64. The same state_dict written as .safetensors with
torchvision's names, read by tessera itself (`--encoder vit-b16`), likewise in fp32.

torchvision zeroes its head at initialisation; the head and the layer norms are drawn at random
here so that every parameter shapes the logits.
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
import torch
import torchvision

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
from tessera_presets import normalise  # noqa: E402
from test_vit_timm import write_safetensors  # noqa: E402

CONVERTER = os.path.join(REPO, "tools", "torch_to_tessera.py")
SLIDE = os.path.join(REPO, "..", "shared", "testdata", "slides", "CMU-1-Small-Region.svs")
TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
TILE, TILES = 224, 4
TOLERANCES = {"fp32": 1e-4, "fp16": 1e-2}


def tissue_tiles(path, count):
    """The `count` 224-pixel tiles of level 0 with the most tissue (darkest on average), uint8 NHWC."""
    slide = openslide.OpenSlide(path)
    width, height = slide.dimensions
    tiles = []
    for y in range(0, height - TILE + 1, TILE):
        for x in range(0, width - TILE + 1, TILE):
            tile = np.asarray(slide.read_region((x, y), 0, (TILE, TILE)).convert("RGB"))
            tiles.append((float(tile.mean()), (x, y), tile))
    slide.close()
    tiles.sort(key=lambda t: t[0])
    return np.stack([t[2] for t in tiles[:count]])


def seeded_vit_b_16(seed):
    torch.manual_seed(seed)
    model = torchvision.models.vit_b_16()
    with torch.no_grad():
        model.heads.head.weight.normal_(0.0, 0.05)
        model.heads.head.bias.normal_(0.0, 0.05)
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.7, 1.3)
                module.bias.normal_(0.0, 0.1)
    return model.eval()


class VitB16MatchesTorchvision(unittest.TestCase):
    def test_logits_on_slide_tiles(self):
        with tempfile.TemporaryDirectory(prefix="tessera-vitb16-") as work:
            model = seeded_vit_b_16(26)
            torch.save(model.state_dict(), os.path.join(work, "vit_b_16.pth"))
            checkpoint = os.path.join(work, "vitb16.h5")
            converted = subprocess.run([sys.executable, CONVERTER, "--state-dict", os.path.join(work, "vit_b_16.pth"),
                                        "--preset", "vit-b16", "--out", checkpoint], capture_output=True, text=True)
            self.assertEqual(converted.returncode, 0, converted.stderr)
            self.assertIn('"classes": 1000', converted.stdout)

            images = normalise(tissue_tiles(SLIDE, TILES))
            with torch.no_grad():
                expected = model.double()(images.double()).numpy()
            self.assertGreater(float(expected.std()), 1e-2, "reference logits are nearly constant")
            inputs = os.path.join(work, "tiles.h5")
            with h5py.File(inputs, "w") as f:
                f.create_dataset("x", data=images.numpy().astype(np.float32))
            safetensors = os.path.join(work, "vit_b_16.safetensors")
            write_safetensors(safetensors, model.float().state_dict())
            runs = [(precision, ["--model", checkpoint]) for precision in TOLERANCES]
            encoder = os.path.join(work, "vit-b16-with-head.json")  # the preset is the encoder, without its head
            with open(encoder, "w") as f:
                json.dump({"preset": "vit-b16", "classes": 1000}, f)
            runs.append(("fp32", ["--model", safetensors, "--encoder", encoder]))
            for precision, model_args in runs:
                tolerance = TOLERANCES[precision]
                outputs = os.path.join(work, f"logits-{precision}-{len(model_args)}.h5")
                result = subprocess.run([TESSERA, "forward", *model_args, "--input", inputs, "--output", outputs,
                                         "--batch", "2", "--precision", precision], capture_output=True, text=True,
                                        timeout=900)
                self.assertEqual(result.returncode, 0, result.stderr)
                with h5py.File(outputs, "r") as f:
                    logits = f["logits"][...]
                self.assertEqual(logits.shape, (TILES, 1000))
                error = float(np.abs(logits - expected).max() / np.abs(expected).max())
                print(f"vit_b_16 ({os.path.basename(model_args[1])}) on {TILES} tiles of CMU-1-Small-Region.svs, "
                      f"{precision}: relative error {error:.3g} (limit {tolerance}); {result.stderr.strip()}",
                      file=sys.stderr)
                self.assertLess(error, tolerance)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        TESSERA = sys.argv.pop(1)
    unittest.main(verbosity=2)
