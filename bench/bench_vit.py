"""Patch-encoder extraction benchmark of issue 26: prints one JSON object.

`tessera extract --encoder` over the tiles of one slide (real pixels: CMU-1-Small-Region.svs's
level 0, written as a one-level TIFF declared at each encoder's microns per pixel, or at CMU-1's
own 0.499 where that is 0.5, so that every tile is read at level 0 and none is resized: tiles of
the encoder's input size, 448 pixels for CONCH v1.5 and 224 for the rest) with random weights,
fp32 and fp16 (fp16 activations, features stored fp16), against PyTorch on the same machine in
the same run: torchvision's vit_b_16 for `vit-b16`, tools/swin_reference.py's Swin-T for
`ctranspath`, and the plain-PyTorch timm reference (tools/vit_reference.py) for every other
preset, eval mode, no gradients, on the same number of tiles in batches of the same size, in
float32 for both of tessera's precisions (PyTorch 1.13 has no float16 matrix products on the CPU,
and its bfloat16 ones, emulated without AVX512-BF16, ran UNI's 8 tiles for over 10 minutes on the
shared machine).
Tessera's rate counts from the first tile on (after the network is built and its weights are
loaded); PyTorch's from its first batch on (after its model is built), both over the same tiles.
Each run also gives tessera's device-busy and data-wait fractions: how much of the run the device
computed, and waited for tiles read straight from the slide.

Run: /usr/bin/python3 bench/bench_vit.py --build build [--encoders vit-b16 uni] [--tiles 8]
     [--batch 4] [--precisions fp32 fp16] [--work DIR] [--keep]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import openslide
import tifffile
import torch
import torchvision

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
from swin_reference import SWIN_PRESETS, SwinTransformer  # noqa: E402
from vit_reference import VIT_PRESETS, VisionTransformer  # noqa: E402

CMU = os.path.join(os.path.dirname(REPO), "shared", "testdata", "slides", "CMU-1-Small-Region.svs")


def torch_model(encoder):
    if encoder == "vit-b16":
        return torchvision.models.vit_b_16().eval()
    if encoder in SWIN_PRESETS:  # CTransPath: tools/swin_reference.py's plain-PyTorch Swin
        return SwinTransformer({"preset": encoder}).eval()
    return VisionTransformer({"preset": encoder}).eval()


def input_size(encoder):
    """The side of the tiles an encoder reads (CONCH v1.5: 448; the rest 224)."""
    preset = VIT_PRESETS.get(encoder) or SWIN_PRESETS.get(encoder) or {}
    return preset.get("preprocessing", {}).get("input_size", preset.get("image_size", 224))


def torch_rate(encoder, tiles, batch):
    torch.manual_seed(0)
    model = torch_model(encoder)
    side = input_size(encoder)
    images = torch.randn((tiles, 3, side, side))
    start = time.perf_counter()
    with torch.no_grad():
        for first in range(0, tiles, batch):
            model(images[first:first + batch])
    return tiles / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", required=True, help="build directory holding tools/tessera")
    parser.add_argument("--encoders", nargs="+", default=["vit-b16", "uni"])
    parser.add_argument("--tiles", type=int, default=8, help="tiles per run")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"], choices=("fp32", "fp16"))
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    tessera = os.path.join(args.build, "tools", "tessera")
    work = args.work or tempfile.mkdtemp(prefix="bench_vit_")
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(os.cpu_count())
    load_before = os.getloadavg()  # the machine is shared: the load says what else ran
    try:
        runs = []
        for encoder in args.encoders:
            # The tiles in rows as wide as the slide's 2220 pixels allow (--tiles rounded up to fill a row).
            side = input_size(encoder)
            with openslide.OpenSlide(CMU) as source:
                columns = min(args.tiles, source.dimensions[0] // side)
                rows = -(-args.tiles // columns)
                pixels = np.asarray(source.read_region((0, 0), 0, (side * columns, side * rows)).convert("RGB"))
            # The pixels declared at CMU-1's own 0.499 um/px, or at an encoder's rate far from 0.5
            # (ctranspath's 1.143), so that every tile is read at level 0 and none is resized.
            mpp = VIT_PRESETS.get(encoder, {}).get("preprocessing", {}).get("microns_per_pixel", 0.5)
            mpp = mpp if abs(mpp - 0.5) > 0.01 else 0.499
            slide = os.path.join(work, f"tiles-{mpp:.4f}-{side}.tif")
            tifffile.imwrite(slide, pixels, tile=(256, 256), photometric="rgb", resolution=(1e4 / mpp, 1e4 / mpp),
                             resolutionunit="CENTIMETER")
            reference = None
            for precision in args.precisions:
                out = os.path.join(work, f"{encoder}-{precision}")
                result = subprocess.run([tessera, "extract", "--encoder", encoder, "--random-weights", "--slides",
                                         slide, "--min-tissue", "0", "--out", out, "--batch", str(args.batch),
                                         "--precision", precision], capture_output=True, text=True)
                if result.returncode != 0:
                    sys.exit(f"tessera extract --encoder {encoder} exited {result.returncode}:\n{result.stderr[-4000:]}")
                summary = json.loads(result.stdout.strip().splitlines()[-1])
                if reference is None:
                    reference = torch_rate(encoder, summary["tiles"], summary["devices"][0]["batch"])
                figures = {
                    "encoder": encoder,
                    "precision": precision,
                    "tiles": summary["tiles"],
                    "batch": summary["devices"][0]["batch"],
                    "device": summary["device"],
                    "tessera_tiles_per_second": summary["features_per_second"],
                    "tessera_device_seconds": summary["device_seconds"],
                    # The data path against the device: tiles read straight from the slide on
                    # --workers threads ahead of it (jobs/README.md).
                    "device_busy_fraction": summary["device_busy_fraction"],
                    "data_wait_fraction": summary["data_wait_fraction"],
                    "workers": summary["workers"],
                    "planned_device_bytes": summary["planned_device_bytes"],
                    "peak_device_bytes": summary["peak_device_bytes"],
                    "torch_dtype": "float32",
                    "torch_tiles_per_second": reference,
                    "ratio_to_torch": summary["features_per_second"] / reference,
                }
                runs.append(figures)
                print(json.dumps(figures), file=sys.stderr, flush=True)  # each run as it ends
        print(json.dumps({"benchmark": "extract --encoder, tiles of each encoder's input size, random weights",
                          "torch": torch.__version__, "threads": torch.get_num_threads(),
                          "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()},
                          "runs": runs}))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
