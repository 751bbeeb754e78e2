"""TransMIL training benchmark (issues 33 and 36): prints one JSON object.

A cohort of --bags bags of about --patches patches each (from 3/4 to 5/4 of it) of --features
random float32 features, two classes alternating. Tessera: `tessera train --features --head
transmil` (width 512, 8 heads, 256 landmarks, fp32 or --precision, Adam, a bag a step) for
--epochs epochs; its rate is the last epoch's bags a second of training (its epoch line's
images_per_second: the training steps alone, after the network is built). PyTorch 1.13 on the
same CPU in the same run: TransMIL as tests/test_mil_heads_torch.py writes it from its published
source (the reference the tests hold tessera's losses and gradients to), float32, Adam, a step a
bag over the same training bags, timed after one bag of warm-up, a thread a core as lavapipe's
(torch.set_num_threads: this machine's OpenMP starts with one). With --baseline, another build
of tessera on the same cohort. The load average before and after is recorded: compare figures
from a quiet machine only.

Run: /usr/bin/python3 bench/bench_mil.py --build build [--baseline OLD_BUILD] [--bags 8]
     [--patches 4000] [--features 1024] [--epochs 2] [--precision fp32|fp16] [--work DIR] [--keep]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from test_mil_heads_torch import transmil_loss, transmil_weights  # noqa: E402

HIDDEN = 512  # TransMIL's width
CLASSES = ("normal", "tumor")


def write_cohort(directory, bags, patches, features, seed=0):
    """<slide>.h5 files in CLAM's layout and a slide,label CSV; returns the bags' sizes."""
    generator = np.random.default_rng(seed)
    sizes = [int(generator.integers(3 * patches // 4, 5 * patches // 4 + 1)) for _ in range(bags)]
    rows = ["slide,label"]
    for b, size in enumerate(sizes):
        with h5py.File(os.path.join(directory, f"s{b}.h5"), "w") as f:
            f["features"] = generator.standard_normal((size, features), dtype=np.float32)
            f["coords"] = np.stack([np.arange(size) * 256, np.zeros(size)], axis=1).astype(np.int64)
        rows.append(f"s{b},{CLASSES[b % 2]}")
    with open(os.path.join(directory, "labels.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    return sizes


def tessera_rate(binary, directory, args):
    command = [binary, "--json", "train", "--features", directory, "--labels", os.path.join(directory, "labels.csv"),
               "--head", "transmil", "--optimizer", "adam", "--lr", "0.0002", "--epochs", str(args.epochs),
               "--val-fraction", "0.25", "--precision", args.precision, "--seed", "1"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"bench_mil: tessera train exited {result.returncode}: {result.stderr[-2000:]}")
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    epochs = [line for line in lines if line.get("event") == "epoch"]
    split = next(line for line in lines if line.get("event") == "split")
    return epochs[-1]["images_per_second"], set(split["held_out_slides"]), epochs[-1]["peak_device_bytes"]


def torch_rate(directory, training, features):
    torch.set_num_threads(os.cpu_count())
    weights = transmil_weights(len(CLASSES), seed=1, hidden=HIDDEN, features=features)
    p = {name: torch.tensor(value, requires_grad=True) for name, value in weights.items()}
    optimizer = torch.optim.Adam(p.values(), lr=0.0002)
    bags = []
    for slide, label in training:
        with h5py.File(os.path.join(directory, slide + ".h5"), "r") as f:
            bags.append((torch.from_numpy(f["features"][:]), label))

    def step(bag, label):
        optimizer.zero_grad()
        transmil_loss(p, bag, label).backward()
        optimizer.step()

    step(*bags[0])  # warm-up
    start = time.perf_counter()
    for bag, label in bags:
        step(bag, label)
    return len(bags) / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--baseline", help="another build directory of tessera, run on the same cohort")
    parser.add_argument("--bags", type=int, default=8)
    parser.add_argument("--patches", type=int, default=4000)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "fp16"), default="fp32")
    parser.add_argument("--work")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.bags < 4:
        sys.exit("bench_mil: --bags must be at least 4 (a quarter are held out, of both classes)")
    work = args.work or tempfile.mkdtemp(prefix="bench_mil_")
    os.makedirs(work, exist_ok=True)
    load_before = os.getloadavg()
    sizes = write_cohort(work, args.bags, args.patches, args.features)
    binary = os.path.join(args.build, "tools", "tessera")
    tessera_bags_per_second, held_out, peak = tessera_rate(binary, work, args)
    baseline = tessera_rate(os.path.join(args.baseline, "tools", "tessera"), work, args)[0] if args.baseline else None
    training = [(f"s{b}", b % 2) for b in range(args.bags) if f"s{b}" not in held_out]
    torch_bags_per_second = torch_rate(work, training, args.features)
    info = json.loads(subprocess.run([binary, "info", "--json"], capture_output=True, text=True, check=True).stdout)
    device = info["devices"][0]
    print(json.dumps({
        "benchmark": "transmil_training", "device": device["name"], "driver": device["driver"],
        "bags": args.bags, "bag_sizes": sizes, "training_bags": len(training), "features": args.features,
        "width": HIDDEN, "precision": args.precision, "epochs": args.epochs,
        "tessera_bags_per_second": tessera_bags_per_second, "tessera_peak_device_bytes": peak,
        "torch_bags_per_second": torch_bags_per_second, "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__, "ratio_to_torch": tessera_bags_per_second / torch_bags_per_second,
        "baseline": {"build": args.baseline, "tessera_bags_per_second": baseline,
                     "speedup": tessera_bags_per_second / baseline} if baseline else None,
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d")}, indent=1))
    if not args.keep and not args.work:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
