"""tessera under a real Slurm cluster (tests/slurm_cluster.py: munged, slurmctld and slurmd from
Debian's packages on this machine), against the same work run directly:
- `sbatch --array=0-2` tiles a synthetic cohort of 4 slides in shards (`--shard
  $SLURM_ARRAY_TASK_ID/3`, one store per task): the stores equal `tessera tile --shard K/3` run
  directly (every tile's bytes, every slide's entry).
- `srun -n 2 tessera train` on the stores trains data-parallel over two MPI ranks (OpenMPI through
  Slurm's PMIx): the same epoch records, 2 replicas, and a bit-identical checkpoint as `mpirun -np 2`.
- A second array extracts features with that checkpoint (`extract --shard $SLURM_ARRAY_TASK_ID/3`):
  the same feature files, bit for bit, as direct extraction.
Stores are read with python3-lmdb, checkpoints and features with h5py. Every tessera process runs
under the validation layer and must print no validation message.
"""
import glob
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from data_tools import read_store, synth, workdir
from slurm_cluster import SlurmCluster, missing_programs

TESSERA = os.path.abspath(os.environ.get("TESSERA_BINARY", "build/tools/tessera"))
SLIDES, SHARDS = 4, 3
TRAIN = ["--model", "small-cnn", "--width", 4, "--epochs", 2, "--batch", 16, "--seed", 5, "--val-fraction", 0.3,
         "--optimizer", "adam", "--lr", 0.01, "--device", 0, "--workers", 1]
# OpenMPI over loopback TCP: shared memory's single-copy path needs ptrace rights containers lack.
ENV = {"TESSERA_VALIDATION": "1", "OMPI_MCA_btl": "self,tcp"}
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def command(*args):
    return " ".join(str(a) for a in args)


def tile_command(slides, out, shard):
    labels = [s.replace(".tiff", ".geojson") for s in slides]
    return command(TESSERA, "tile", *slides, "--labels", *labels, "--size", 32, "--allow-empty-labels",
                   "--unannotated", "Normal",
                   "--workers", 1, "--out", out, "--shard", shard)


def extract_command(model, stores, out, shard):
    return command(TESSERA, "extract", "--model", model, "--layer", "pool2", "--tiles", stores, "--out", out,
                   "--shard", shard, "--workers", 1, "--device", 0)


def train_command(stores, checkpoint):
    return command(TESSERA, "train", "--data", stores, *TRAIN, "--checkpoint", checkpoint)


def shell(line, env):
    result = subprocess.run(line, shell=True, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, (line, result.stdout[-2000:], result.stderr[-3000:])
    assert "vulkan validation" not in result.stderr.lower(), result.stderr[-3000:]
    return result


def sbatch_array(cluster, work, name, task_line):
    """Runs `task_line` (which reads $SLURM_ARRAY_TASK_ID) as an array of SHARDS tasks; waits for it."""
    script = os.path.join(work, name + ".sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/bash\n#SBATCH --job-name={name}\n#SBATCH --output={work}/{name}_%a.out\n"
                f"set -euo pipefail\n{task_line}\n")
    result = subprocess.run(["sbatch", f"--array=0-{SHARDS - 1}", "--wait", "--chdir", work, script],
                            capture_output=True, text=True, env=cluster.env, timeout=900)
    outputs = {path: open(path, errors="replace").read() for path in sorted(glob.glob(f"{work}/{name}_*.out"))}
    assert result.returncode == 0, (result.stdout, result.stderr, outputs, cluster.logs())
    assert len(outputs) == SHARDS, outputs
    for path, text in outputs.items():
        assert "vulkan validation" not in text.lower(), (path, text[-3000:])
    return outputs


def epoch_records(stderr):
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{") and '"event":"epoch"' in line]


def datasets(path):
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda key, item: found.__setitem__(key, item[()]) if isinstance(item, h5py.Dataset) else None)
    return found


def assert_same_files(a, b):
    left, right = datasets(a), datasets(b)
    assert sorted(left) == sorted(right), (a, sorted(left), sorted(right))
    for key, value in left.items():
        assert np.array_equal(value, right[key]), (a, key)
    return left


@pytest.fixture(scope="module")
def cohort():
    missing = missing_programs()
    assert not missing, f"{missing} missing: bash tools/install-deps.sh --tests installs Slurm and munge"
    work = workdir("test_slurm")
    slides = []
    for index in range(SLIDES):
        path = os.path.join(work, f"slide{index}.tiff")
        synth(TESSERA, path, 512, 384, 60 + index)
        slides.append(path)
    yield work, slides
    shutil.rmtree(work, ignore_errors=True)


def test_array_tiles_trains_and_extracts_as_a_direct_run(cohort):
    work, slides = cohort
    env = dict(os.environ, **ENV)
    # The same work run directly: each shard in turn, training under mpirun.
    direct = os.path.join(work, "direct")
    os.makedirs(f"{direct}/stores")
    for k in range(SHARDS):
        shell(tile_command(slides, f"{direct}/stores/part{k}.lmdb", f"{k}/{SHARDS}"), env)
    direct_train = shell(command(*MPIRUN, train_command(f"{direct}/stores", f"{direct}/model.h5")), env)
    for k in range(SHARDS):
        shell(extract_command(f"{direct}/model.h5", f"{direct}/stores", f"{direct}/features", f"{k}/{SHARDS}"), env)

    scheduled = os.path.join(work, "slurm")
    os.makedirs(f"{scheduled}/stores")
    with SlurmCluster() as cluster:
        env = dict(cluster.env, **ENV)
        sbatch_array(cluster, scheduled, "tile",
                     tile_command(slides, scheduled + "/stores/part$SLURM_ARRAY_TASK_ID.lmdb",
                                  f"$SLURM_ARRAY_TASK_ID/{SHARDS}"))
        slurm_train = shell(command("srun", "-n", 2, train_command(f"{scheduled}/stores", f"{scheduled}/model.h5")),
                            env)
        sbatch_array(cluster, scheduled, "extract",
                     extract_command(f"{scheduled}/model.h5", f"{scheduled}/stores", f"{scheduled}/features",
                                     f"$SLURM_ARRAY_TASK_ID/{SHARDS}"))

    # The array's stores are the direct run's, shard by shard; together they hold every slide.
    stored = set()
    assert sorted(os.listdir(f"{scheduled}/stores")) == [f"part{k}.lmdb" for k in range(SHARDS)]
    for k in range(SHARDS):
        tiles, entries = read_store(f"{scheduled}/stores/part{k}.lmdb")
        assert (tiles, entries) == read_store(f"{direct}/stores/part{k}.lmdb"), k
        stored |= {entry["path"] for entry in entries.values()}
    assert stored == set(slides), stored

    # srun -n 2 is a two-rank data-parallel run, equal to mpirun -np 2's.
    records, expected = epoch_records(slurm_train.stderr), epoch_records(direct_train.stderr)
    assert [r["epoch"] for r in records] == [1, 2] and all(r["replicas"] == 2 for r in records), slurm_train.stderr
    for record, reference in zip(records, expected):
        for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "train_samples", "val_samples"):
            assert record[key] == reference[key], (key, record, reference)
    weights = assert_same_files(f"{scheduled}/model.h5", f"{direct}/model.h5")
    assert any(key.startswith("params/") for key in weights), sorted(weights)

    # The extract array's feature files are the direct run's, bit for bit.
    names = sorted(n for n in os.listdir(f"{direct}/features") if n.endswith(".h5"))  # runs/ holds the reports
    assert names == sorted(os.path.basename(s).replace(".tiff", ".h5") for s in slides)
    assert sorted(n for n in os.listdir(f"{scheduled}/features") if n.endswith(".h5")) == names
    for name in names:
        features = assert_same_files(f"{scheduled}/features/{name}", f"{direct}/features/{name}")
        assert features["features"].shape[0] == features["coords"].shape[0] > 0, name
