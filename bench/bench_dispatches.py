"""Dispatches and device time of UNI's ViT-L/16 extraction under TESSERA_PROFILE=1: prints one
JSON object with every dispatch a batch, and blocks.0's profile entries (name, commands, seconds).
`tessera extract --encoder uni --random-weights` over the 4 tiles of a synthetic 448 px slide at
batch 4 (bench_roofline's store). Fusion shows as fewer entries a block (bench/README.md).

Run: /usr/bin/python3 bench/bench_dispatches.py build/tools/tessera
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_roofline import profiled, synthetic_tiles  # noqa: E402


def main():
    tessera = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="tessera-dispatches-") as work:
        store = synthetic_tiles(tessera, work, "vit", 448)
        start = time.time()
        profile, _ = profiled([tessera, "extract", "--encoder", "uni", "--random-weights", "--tiles", store,
                               "--out", os.path.join(work, "out"), "--batch", "4"])
        # Once-only work (the weights' preparation, uploads, downloads) is not a batch's.
        per_batch = [e for e in profile["kernels"]
                     if " prepare " not in e["name"] and not e["name"].startswith(("upload", "download"))]
        block = sorted((e["name"], e["commands"], round(e["seconds"], 4)) for e in per_batch
                       if e["name"].startswith("blocks.0."))
        print(json.dumps({"binary": tessera, "load_average_1min": os.getloadavg()[0],
                          "wall_seconds": time.time() - start, "device_seconds": profile["seconds"],
                          "entries_total": len(profile["kernels"]),
                          "dispatches_all": sum(e["commands"] for e in per_batch),
                          "block0_entries": len(block), "block0_dispatches": sum(c for _, c, _ in block),
                          "block0": block}))


if __name__ == "__main__":
    main()
