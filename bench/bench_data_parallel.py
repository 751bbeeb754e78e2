"""Data-parallel training benchmark of issue 14, in one run: prints one JSON object.

A training step of the same global batch on one device, on two replicas in one process
(`--devices D,D`, and for a model with batch norm (resnet18) also with `--sync-bn`, whose batch
norms wait for every replica twice a step)
and on two MPI ranks (`mpirun -np 2`, loopback), each timed over the second
epoch (the first warms up), with the gradient all-reduce's throughput: the bytes of one
replica's gradients summed per second of host time (over the process's replicas, and over MPI
for the ranks), as the epoch records report it (for the ranks this includes waiting for the
slower rank); and the all-reduce alone on 64 MiB host buffers (build/bench/bench_allreduce), in
one process over two copies and over two MPI ranks. On lavapipe the "two devices" are the one CPU
device opened twice, so the replicas share the same cores; on a machine with two GPUs pass
--devices 0,1.

Run: /usr/bin/python3 bench/bench_data_parallel.py --build build [--model small-cnn|resnet18]
     [--batch 64] [--size 32] [--steps 20] [--devices 0,0]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp"]


def second_epoch(command):
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {run.returncode}:\n{run.stderr[-3000:]}")
    epochs = [json.loads(line) for line in run.stderr.splitlines() if '"event":"epoch"' in line]
    return epochs[-1]


def figures(record, batch):
    result = {"images_per_second": record["images_per_second"],
              "step_seconds": batch / record["images_per_second"]}
    if "allreduce_bytes_per_second" in record:
        result["allreduce_bytes_per_second"] = record["allreduce_bytes_per_second"]
        result["replicas"] = record["replicas"]
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--model", default="small-cnn")
    parser.add_argument("--width", type=int, default=32, help="small-cnn's width")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--devices", default="0,0")
    args = parser.parse_args()
    tessera = os.path.join(args.build, "tools", "tessera")
    first_device = args.devices.split(",")[0]
    with tempfile.TemporaryDirectory() as work:
        patches = os.path.join(work, "patches.h5")
        rng = np.random.default_rng(0)
        with h5py.File(patches, "w") as f:
            f["x"] = rng.integers(0, 256, (args.batch * args.steps, args.size, args.size, 3), dtype=np.uint8)
            f["y"] = rng.integers(0, 2, args.batch * args.steps, dtype=np.uint8)
        train = [tessera, "train", "--data", patches, "--model", args.model, "--batch", str(args.batch),
                 "--val-fraction", "0", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.01"]
        if args.model == "small-cnn":
            train += ["--width", str(args.width)]
        checkpoint = os.path.join(work, "weights.h5")
        one = figures(second_epoch(train + ["--epochs", "2", "--device", first_device, "--checkpoint", checkpoint]),
                      args.batch)
        with h5py.File(checkpoint, "r") as f:
            parameters = sum(int(f["params"][name].size) for name in f["params"]
                             if not name.endswith(("running_mean", "running_var")))
            batch_norm = any(name.endswith("running_mean") for name in f["params"])
        train += ["--epochs", "2"]
        devices = figures(second_epoch(train + ["--devices", args.devices]), args.batch)
        synced = (figures(second_epoch(train + ["--devices", args.devices, "--sync-bn"]), args.batch)
                  if batch_norm else None)
        ranks = figures(second_epoch(MPIRUN + ["-np", "2"] + train + ["--device", first_device]), args.batch)
    allreduce = [tessera.replace(os.path.join("tools", "tessera"), os.path.join("bench", "bench_allreduce")), "64"]
    alone = {"in_process_2_replicas": json.loads(subprocess.run(allreduce + ["2"], capture_output=True, text=True,
                                                                check=True).stdout),
             "mpi_2_ranks": json.loads(subprocess.run(MPIRUN + ["-np", "2"] + allreduce + ["1"], capture_output=True,
                                                      text=True, check=True).stdout)}
    sync_bn = {}
    if synced:
        sync_bn = {"devices_sync_bn": dict(synced, flag="--devices " + args.devices + " --sync-bn"),
                   "sync_bn_step_ratio": synced["step_seconds"] / devices["step_seconds"]}
    print(json.dumps({
        "benchmark": "data_parallel_training",
        "model": args.model, "batch": args.batch, "size": args.size, "steps_per_epoch": args.steps,
        "gradient_bytes": parameters * 4,
        "one_device": one,
        "devices": dict(devices, flag="--devices " + args.devices),
        "mpi_ranks": dict(ranks, flag="mpirun -np 2 ... --device " + first_device),
        "speedup_devices": devices["images_per_second"] / one["images_per_second"],
        **sync_bn,
        "speedup_mpi_ranks": ranks["images_per_second"] / one["images_per_second"],
        "allreduce_alone_bytes_per_second": {k: v["bytes_per_second"] for k, v in alone.items()},
    }))


if __name__ == "__main__":
    sys.exit(main())
