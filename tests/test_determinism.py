"""The same command on the same device gives bit-identical weights.

small-cnn on 256 px tiles has an fc1.weight of 128 x 262144 fp32: exactly lavapipe's 128 MiB
maxStorageBufferRange, where three runs of one command used to give three checkpoints. Here two
runs with `--workers 4`, and two with `--devices 0,0` (two alike devices where the machine has them;
skipped on one GPU, which tessera opens once), of `train --data A.lmdb B.lmdb --model
small-cnn --batch 8` on two slides tiled at 256 px, must give checkpoints equal bit for bit,
every dataset read back by h5py; and so must the same on 64 px tiles. Every run is under the
Khronos validation layer.
"""
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from data_tools import replica_devices, summary, synth, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


def run(*args):
    result = subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (args, result.returncode, result.stderr[-3000:])
    assert "Validation" not in result.stderr, result.stderr[-3000:]
    return result


def datasets(path):
    """Every dataset of a checkpoint as raw bytes, by name."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: out.__setitem__(name, np.asarray(item).tobytes())
                     if isinstance(item, h5py.Dataset) else None)
    return out


def differing(first, other):
    """Names whose bytes differ, with the count of differing float32 elements."""
    names = {}
    for name in sorted(set(first) | set(other)):
        a, b = first.get(name), other.get(name)
        if a is None or b is None or len(a) != len(b):
            names[name] = "missing or resized"
        elif a != b:
            names[name] = int(np.count_nonzero(np.frombuffer(a, np.uint32) != np.frombuffer(b, np.uint32)))
    return names


def stores(work, size):
    made = []
    for seed in (1, 2):
        slide = os.path.join(work, f"slide{seed}.tiff")
        if not os.path.exists(slide):
            synth(TESSERA, slide, 1536, 1536, seed)
        store = os.path.join(work, f"s{seed}-{size}.lmdb")
        tiled = summary(run("tile", slide, "--out", store, "--size", size, "--labels",
                            os.path.join(work, f"slide{seed}.geojson"), "--unannotated", "Normal",
                            "--allow-empty-labels"))
        assert tiled["slides"][0]["tiles"] > 0, tiled
        made.append(store)
    return made


def check_runs(work, data, name, *flags):
    checkpoints = []
    for attempt in range(2):
        checkpoint = os.path.join(work, f"{name}-{attempt}.h5")
        run("train", "--data", *data, "--model", "small-cnn", "--batch", 8, "--epochs", 1, "--seed", 5,
            "--val-fraction", 0, "--checkpoint", checkpoint, *flags)
        checkpoints.append(datasets(checkpoint))
    assert not differing(*checkpoints), (name, differing(*checkpoints))
    return checkpoints[0]


@pytest.fixture(scope="module")
def work():
    work = workdir("test_determinism")
    yield work
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def large_tiles(work):
    """The two slides tiled at 256 px, made once for both tests."""
    return stores(work, 256)


def test_two_runs_are_bit_identical_at_the_buffer_range_limit(work, large_tiles):
    weights = check_runs(work, large_tiles, "workers", "--workers", 4)
    with h5py.File(os.path.join(work, "workers-0.h5"), "r") as f:
        assert f["params/fc1.weight"].shape == (128, 262144), f["params/fc1.weight"].shape
    assert np.isfinite(np.frombuffer(weights["params/fc1.weight"], np.float32)).all()
    check_runs(work, stores(work, 64), "small-tiles", "--workers", 4)


def test_two_runs_on_two_replicas_are_bit_identical_at_the_buffer_range_limit(work, large_tiles):
    check_runs(work, large_tiles, "devices", "--devices", replica_devices(TESSERA))
