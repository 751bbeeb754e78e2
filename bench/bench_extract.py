"""Feature extraction benchmark of issue 4: prints one JSON object.

`tessera extract` of resnet18 up to layer4 (512 features per tile after global average
pooling) over the 224x224 tissue tiles of a synthetic slide: features per second (after the
network is built), the share of that wall time spent in HDF5 writes (the writer thread's
append and flush), the device seconds, and peak resident memory (from /usr/bin/time -v).

Run: /usr/bin/python3 bench/bench_extract.py --build build [--size 4096] [--batch 32]
     [--precision fp32|fp16] [--work DIR] [--keep]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def timed(command):
    """Runs under /usr/bin/time -v; returns (peak RSS bytes, stdout)."""
    result = subprocess.run(["/usr/bin/time", "-v", *map(str, command)], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(map(str, command))} exited {result.returncode}:\n{result.stderr[-4000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr).group(1)) * 1024
    return peak, result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", required=True, help="build directory holding tools/tessera")
    parser.add_argument("--size", type=int, default=4096, help="slide width and height in pixels")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    tessera = os.path.join(args.build, "tools", "tessera")
    work = args.work or tempfile.mkdtemp(prefix="bench_extract_")
    os.makedirs(work, exist_ok=True)
    try:
        slide, store, out = (os.path.join(work, name) for name in ("slide.tiff", "tiles.lmdb", "features"))
        subprocess.run([tessera, "synth", slide, "--width", str(args.size), "--height", str(args.size), "--seed", "1"],
                       check=True, capture_output=True)
        subprocess.run([tessera, "tile", slide, "--out", store, "--size", "224"], check=True, capture_output=True)
        peak, stdout = timed([tessera, "extract", "--model", "resnet18", "--random-weights", "--layer", "layer4", "--tiles", store,
                              "--out", out, "--batch", args.batch, "--precision", args.precision])
        run = json.loads(stdout.strip().splitlines()[-1])
        figures = {
            "benchmark": "extract resnet18 layer4, 224x224 tiles",
            "device": run["device"],
            "tiles": run["tiles"],
            "batch": args.batch,
            "precision": args.precision,
            "features_per_second": run["features_per_second"],
            "seconds": run["seconds"],
            "device_seconds": run["device_seconds"],
            "hdf5_write_seconds": run["hdf5_write_seconds"],
            "hdf5_write_share": run["hdf5_write_share"],
            "feature_width": run["extraction"]["output_shape"][0],
            "peak_rss_bytes": peak,
        }
        print(json.dumps(figures))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
