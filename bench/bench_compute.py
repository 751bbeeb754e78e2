"""Compute benchmark of issue 2, in one run: prints one JSON object.

GEMM GFLOPS at 1024^3 (bench_gemm), and images/second forward and for a training step for
small-cnn at batch 64 on 3x96x96 and resnet18 at batch 16 on 3x224x224 (tessera forward and
tessera train on generated data), and tiles/second of CLAM's features (`tessera extract
--model resnet50 --layer layer3`, batch 8 as in the figures from before activation reuse, when
batch 16 did not fit lavapipe's 2 GiB; over the 224x224 tiles of a synthetic slide),
beside the same figures from PyTorch on the same machine (bench_torch.py) when
/usr/bin/python3 has torch, and the ratios tessera / PyTorch. Each tessera figure also in mixed
precision (`--precision fp16`, keys "<model> fp16"), against PyTorch in float32 (on a CPU
PyTorch's autocast is bfloat16, not fp16: float32 is its figure to beat there).

The run's date, `tessera info` (device and driver) and the load average come with the figures.
With --baseline OTHER_BUILD, every tessera figure is measured for both builds in this run, each
figure's pair back to back (the other build first), and "against_baseline" holds this build's
figure over the other's: the check that a change left the device no slower. --rounds N repeats
each pair N times, the builds' order alternating, and keeps each build's best.

Run: /usr/bin/python3 bench/bench_compute.py --build build [--baseline OLD_BUILD] [--skip-resnet]
     [--skip-pytorch] [--device cpu|cuda]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = (("small-cnn", 64, 96, 3), ("resnet18", 16, 224, 2))  # name, batch, side, training steps


def last_json(text, key):
    for line in reversed(text.splitlines()):
        if line.startswith("{") and key in line:
            return json.loads(line)
    raise RuntimeError(f"no JSON line with {key} in:\n{text[-2000:]}")


def tessera_figures(tessera, model, batch, size, steps, work, precision):
    """images/s of tessera forward (device time after the first batch) and of training steps
    (the second epoch; the first warms up, as PyTorch's figures have untimed warm-up runs),
    with the training run's five longest kernels (TESSERA_PROFILE)."""
    images = os.path.join(work, f"{model}-x.h5")
    rng = np.random.default_rng(0)
    with h5py.File(images, "w") as f:
        f["x"] = rng.standard_normal((batch * 3, 3, size, size), dtype=np.float32)
    classes = "1000" if model == "resnet18" else "2"
    run = subprocess.run([tessera, "forward", "--model", model, "--random-weights", "--classes", classes, "--input", images,
                          "--output", os.path.join(work, "logits.h5"), "--batch", str(batch), "--precision", precision],
                         capture_output=True, text=True, check=True)
    # The summary is the last line of stdout (progress lines go to stderr).
    forward = last_json(run.stdout, "images_per_second")["steady_images_per_second"]

    patches = os.path.join(work, f"{model}-patches.h5")
    with h5py.File(patches, "w") as f:
        f["x"] = rng.integers(0, 256, (batch * steps, size, size, 3), dtype=np.uint8)
        # PCam labels are uint8: resnet18 trains a 2-class head here (the fc layer is a rounding
        # error of its cost).
        f["y"] = rng.integers(0, 2, batch * steps, dtype=np.uint8)
    run = subprocess.run([tessera, "train", "--data", patches, "--model", model, "--batch", str(batch),
                          "--epochs", "2", "--val-fraction", "0", "--optimizer", "sgd", "--momentum", "0.9",
                          "--lr", "0.01", "--precision", precision], capture_output=True, text=True, check=True,
                         env=dict(os.environ, TESSERA_PROFILE="1"))
    epochs = [json.loads(line) for line in run.stderr.splitlines() if '"event":"epoch"' in line]
    profile = last_json(run.stderr, '"event":"profile"')
    longest = [{"name": k["name"], "share": round(k["share"], 3)} for k in profile["kernels"][:5]]
    return {"forward_images_per_second": forward, "train_images_per_second": epochs[-1]["images_per_second"],
            "train_first_epoch_images_per_second": epochs[0]["images_per_second"], "train_longest_kernels": longest}


def resnet50_extraction(tessera, batch, tiles, work, precision):
    """Tiles/s of `tessera extract --layer layer3` with resnet50 (features per second after the
    network is built: reading, decoding, the device and the HDF5 writes). The slide and its store
    are made in `tiles` once and kept for later runs; the features go to `work`."""
    slide, store = os.path.join(tiles, "slide.tiff"), os.path.join(tiles, "tiles.lmdb")
    if not os.path.exists(store):
        subprocess.run([tessera, "synth", slide, "--width", "3072", "--height", "3072", "--seed", "1"], check=True,
                       capture_output=True)
        subprocess.run([tessera, "tile", slide, "--out", store, "--size", "224"], check=True, capture_output=True)
    run = subprocess.run([tessera, "extract", "--model", "resnet50", "--random-weights", "--layer", "layer3",
                          "--tiles", store, "--out", os.path.join(work, "features-" + precision), "--batch", str(batch),
                          "--precision", precision], capture_output=True, text=True, check=True)
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    return {"batch": batch, "tiles": summary["tiles"], "tiles_per_second": summary["features_per_second"],
            "feature_width": summary["extraction"]["output_shape"][0]}


def is_throughput(key, value):
    """A figure where more is better: images, tiles or features per second, GFLOPS."""
    return key.endswith(("per_second", "gflops")) and isinstance(value, (int, float))


def best_of(rounds):
    """One figure over several rounds: each throughput its best round's (the machine's load only
    ever slows a run), the rest as the last round gave it."""
    best = dict(rounds[-1])
    for key, value in best.items():
        if is_throughput(key, value):
            best[key] = max(r[key] for r in rounds)
    return best


def tessera_runs(builds, skip_resnet, rounds, tiles):
    """Every tessera figure for each build in `builds` (name -> build directory), the builds'
    runs of one figure back to back so that the machine's load falls alike on both, in turn
    first and second over the rounds. Each build's extraction store is made once, under `tiles`."""
    def figure(name, kind, precision):
        build = builds[name]
        if kind == "gemm":
            gemm = subprocess.run([os.path.join(build, "bench", "bench_gemm")], capture_output=True, text=True,
                                  check=True)
            return json.loads(gemm.stdout)
        tessera = os.path.join(build, "tools", "tessera")
        with tempfile.TemporaryDirectory() as work:
            if kind == "resnet50_layer3_extract":
                os.makedirs(os.path.join(tiles, name), exist_ok=True)
                return resnet50_extraction(tessera, 8, os.path.join(tiles, name), work, precision)
            model, batch, size, steps = next(m for m in MODELS if m[0] == kind)
            return tessera_figures(tessera, model, batch, size, steps, work, precision)

    def measure(kind, precision):
        measured = {name: [] for name in builds}
        for round_index in range(rounds):
            order = list(builds)
            for name in order if round_index % 2 == 0 else reversed(order):
                measured[name].append(figure(name, kind, precision))
        return {name: best_of(runs) for name, runs in measured.items()}

    results = {name: {} for name in builds}
    for name, best in measure("gemm", "fp32").items():
        results[name]["gemm"] = best
    kinds = ["small-cnn"] + ([] if skip_resnet else ["resnet18", "resnet50_layer3_extract"])
    for precision, suffix in (("fp32", ""), ("fp16", " fp16")):
        for kind in kinds:
            for name, best in measure(kind, precision).items():
                results[name][kind + suffix] = best
    return results


def against_baseline(ours, theirs):
    """ours / theirs for every throughput both builds report (above 1: this build is faster)."""
    out = {"gemm_1024_gflops": ours["gemm"]["gemm_1024_gflops"] / theirs["gemm"]["gemm_1024_gflops"]}
    for figure, values in ours.items():
        if figure == "gemm":
            continue
        for key, value in values.items():
            if is_throughput(key, value) and theirs.get(figure, {}).get(key):
                out[f"{figure} {key}"] = value / theirs[figure][key]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"), help="CMake build directory")
    parser.add_argument("--baseline", help="another build directory, measured beside --build in this run")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each figure per build, the builds' order alternating; the best is kept")
    parser.add_argument("--skip-resnet", action="store_true", help="leave the resnets out (slow on lavapipe)")
    parser.add_argument("--skip-pytorch", action="store_true", help="leave PyTorch's figures out")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="PyTorch's device")
    args = parser.parse_args()
    builds = {"baseline": args.baseline} if args.baseline else {}
    builds["tessera"] = args.build
    info = subprocess.run([os.path.join(args.build, "tools", "tessera"), "info", "--json"], capture_output=True,
                          text=True, check=True)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "info": json.loads(info.stdout),
              "cores": os.cpu_count(), "load_average_at_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tiles:
        result.update(tessera_runs(builds, args.skip_resnet, args.rounds, tiles))
    result["load_average_at_end"] = os.getloadavg()[0]
    if args.baseline:
        result["builds"] = {name: os.path.abspath(build) for name, build in builds.items()}
        result["against_baseline"] = against_baseline(result["tessera"], result["baseline"])
    if not args.skip_pytorch:
        try:
            torch = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "bench_torch.py"),
                                    "--device", args.device], capture_output=True, text=True, check=True)
            result["pytorch"] = json.loads(torch.stdout)
        except (OSError, subprocess.CalledProcessError) as error:
            result["pytorch"] = {"unavailable": str(error)}
        result["ratios"] = ratios(result)
    json.dump(result, sys.stdout, indent=2)
    print()


def ratios(result):
    """tessera / PyTorch for each figure both have (bench_torch.py names models with '_')."""
    out = {}
    torch = result.get("pytorch", {})
    pairs = (("forward_images_per_second", "forward_images_per_s"),
             ("train_images_per_second", "train_step_images_per_s"))
    for suffix in ("", " fp16"):
        for model in ("small-cnn", "resnet18"):
            ours, theirs = result["tessera"].get(model + suffix), torch.get(model.replace("-", "_"))
            if not ours or not isinstance(theirs, dict):
                continue
            for our_key, their_key in pairs:
                if theirs.get(their_key):
                    out[f"{model}{suffix} {our_key}"] = ours[our_key] / theirs[their_key]
        ours, theirs = result["tessera"].get("resnet50_layer3_extract" + suffix), torch.get("resnet50_layer3_extract")
        if ours and isinstance(theirs, dict) and theirs.get("tiles_per_s"):
            out[f"resnet50_layer3_extract{suffix} tiles_per_second"] = ours["tiles_per_second"] / theirs["tiles_per_s"]
    if torch.get("gemm_1024_gflops"):
        out["gemm_1024"] = result["tessera"]["gemm"]["gemm_1024_gflops"] / torch["gemm_1024_gflops"]
    return out


if __name__ == "__main__":
    main()
