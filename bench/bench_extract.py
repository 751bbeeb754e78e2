"""Feature extraction benchmark of issues 4 and 14: prints one JSON object.

`tessera extract` of resnet18 up to layer4 (512 features per tile after global average
pooling) over the 224x224 tissue tiles of synthetic slides, once per device list (default: one
device, then `--devices 0,0`, which on lavapipe opens the one CPU device twice): features per
second (after the network is built), the share of that wall time spent in HDF5 writes (the
writer threads' append and flush), the device seconds, and peak resident memory (from
/usr/bin/time -v). Slides are spread over the devices, so give at least as many slides.

Run: /usr/bin/python3 bench/bench_extract.py --build build [--slides 4] [--size 2048] [--batch 32]
     [--devices 0 0,0] [--precision fp32|fp16] [--work DIR] [--keep]
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
    parser.add_argument("--slides", type=int, default=4, help="synthetic slides")
    parser.add_argument("--size", type=int, default=2048, help="slide width and height in pixels")
    parser.add_argument("--devices", nargs="+", default=["0", "0,0"],
                        help="device lists to compare, each a run (`0,0`: the first device opened twice)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    tessera = os.path.join(args.build, "tools", "tessera")
    work = args.work or tempfile.mkdtemp(prefix="bench_extract_")
    os.makedirs(work, exist_ok=True)
    try:
        store = os.path.join(work, "tiles.lmdb")
        slides = [os.path.join(work, f"slide{i}.tiff") for i in range(args.slides)]
        for seed, slide in enumerate(slides, 1):
            subprocess.run([tessera, "synth", slide, "--width", str(args.size), "--height", str(args.size), "--seed",
                            str(seed)], check=True, capture_output=True)
        subprocess.run([tessera, "tile", *slides, "--out", store, "--size", "224"], check=True, capture_output=True)
        runs = []
        for devices in args.devices:
            out = os.path.join(work, "features-" + devices.replace(",", "-"))
            peak, stdout = timed([tessera, "extract", "--model", "resnet18", "--random-weights", "--layer", "layer4",
                                  "--tiles", store, "--out", out, "--batch", args.batch, "--precision",
                                  args.precision, "--devices", devices])
            run = json.loads(stdout.strip().splitlines()[-1])
            runs.append({
                "devices": devices,
                "device": run["device"],
                "tiles": run["tiles"],
                "slides_per_device": [d["slides"] for d in run["devices"]],
                "features_per_second": run["features_per_second"],
                "seconds": run["seconds"],
                "device_seconds": run["device_seconds"],
                "hdf5_write_seconds": run["hdf5_write_seconds"],
                "hdf5_write_share": run["hdf5_write_share"],
                "peak_rss_bytes": peak,
            })
        figures = {
            "benchmark": "extract resnet18 layer4, 224x224 tiles",
            "slides": args.slides,
            "batch": args.batch,
            "precision": args.precision,
            "feature_width": run["extraction"]["output_shape"][0],
            "runs": runs,
            "speedup": runs[-1]["features_per_second"] / runs[0]["features_per_second"],
        }
        print(json.dumps(figures))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
