"""Throughput by batch on one device: what the default batch of `train` and `extract` is chosen
from (jobs/batch_choice.h). Prints one JSON object.

For each batch: `tessera extract` of small-cnn (up to relu3), resnet50 (up to layer3: CLAM's
resnet50_trunc) and the vit-b16 encoder (random weights) over the same tiles, as device seconds
per tile (the models' own time, without reading) and tiles per second of the whole run, with the
peak resident memory; and `tessera train` of resnet18 on 224x224 patches, as images per second of
the second epoch (the first compiles the pipelines). The features of every batch are compared
with the first batch's: batching must not change them.

Run: /usr/bin/python3 bench/bench_batch.py --build build [--batches 1 2 4 8 16 32] [--work DIR]
     [--only extract|train] [--models small-cnn resnet50 vit-b16]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from bench_extract import timed  # peak RSS and stdout of a command under /usr/bin/time -v


def features_of(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".h5"):
            with h5py.File(os.path.join(directory, name), "r") as f:
                out[name] = f["features"][:]
    return out


def extraction(tessera, work, model, store, slides, batch):
    out = os.path.join(work, f"features-{model}-{batch}")
    if model == "vit-b16":
        source = ["--encoder", "vit-b16", "--random-weights", "--slides", *slides]
    else:
        layer = "relu3" if model == "small-cnn" else "layer3"
        source = ["--model", model, "--random-weights", "--layer", layer, "--tiles", store]
    peak, stdout = timed([tessera, "extract", *source, "--out", out, "--batch", batch, "--overwrite"])
    summary = json.loads(stdout.strip().splitlines()[-1])
    return out, {"batch": batch, "tiles": summary["tiles"],
                 "device_seconds_per_tile": summary["device_seconds"] / summary["tiles"],
                 "tiles_per_second": summary["tiles_per_second"], "peak_rss_bytes": peak,
                 "planned_device_bytes": summary["planned_device_bytes"]}


def training(tessera, work, patches, batch):
    peak, stdout = timed([tessera, "train", "--data", patches, "--model", "resnet18", "--batch", batch, "--epochs", 2,
                          "--val-fraction", 0, "--report-fd", 1])  # the report lines on stdout
    epochs = [json.loads(line).get("metrics", {}) for line in stdout.splitlines() if line.startswith("{")]
    epochs = [e for e in epochs if e.get("event") == "epoch"]
    return {"batch": batch, "images_per_second": epochs[-1]["images_per_second"],
            "peak_device_bytes": epochs[-1]["peak_device_bytes"], "peak_rss_bytes": peak}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", required=True, help="build directory holding tools/tessera")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--models", nargs="+", default=["small-cnn", "resnet50", "vit-b16"])
    parser.add_argument("--only", choices=("extract", "train"))
    parser.add_argument("--size", type=int, default=1536, help="slide side in pixels (0.25 um/px)")
    parser.add_argument("--train-images", type=int, default=64)
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    args = parser.parse_args()
    tessera = os.path.join(args.build, "tools", "tessera")
    work = args.work or tempfile.mkdtemp(prefix="bench_batch_")
    os.makedirs(work, exist_ok=True)
    info = subprocess.run([tessera, "info"], capture_output=True, text=True).stdout.splitlines()[0]
    report = {"device": info, "cores": os.cpu_count()}
    if args.only != "train":
        slides = [os.path.join(work, f"slide{i}.tiff") for i in (1, 2)]
        for seed, slide in enumerate(slides, 1):
            if not os.path.exists(slide):
                subprocess.run([tessera, "synth", slide, "--width", str(args.size), "--height", str(args.size),
                                "--seed", str(seed)], check=True, capture_output=True)
        store = os.path.join(work, "tiles.lmdb")
        if not os.path.exists(store):
            subprocess.run([tessera, "tile", *slides, "--out", store, "--size", "224"], check=True,
                           capture_output=True)
        report["extract"] = {}
        for model in args.models:
            rows, first = [], None
            for batch in args.batches:
                out, row = extraction(tessera, work, model, store, slides, batch)
                features = features_of(out)
                if first is None:
                    first = features
                row["max_difference_from_first_batch"] = max(
                    float(np.max(np.abs(features[k] - first[k]))) for k in first)
                rows.append(row)
                print(json.dumps({"model": model, **row}), file=sys.stderr)
            report["extract"][model] = rows
    if args.only != "extract":
        patches = os.path.join(work, "patches.h5")
        rng = np.random.default_rng(0)
        with h5py.File(patches, "w") as f:
            f["x"] = rng.integers(0, 256, (args.train_images, 224, 224, 3), dtype=np.uint8)
            f["y"] = rng.integers(0, 2, args.train_images, dtype=np.uint8)
        report["train_resnet18"] = []
        for batch in args.batches:
            if batch > args.train_images:
                continue
            row = training(tessera, work, patches, batch)
            report["train_resnet18"].append(row)
            print(json.dumps({"model": "train resnet18", **row}), file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
