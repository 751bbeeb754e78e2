"""`tessera extract --devices`: slides spread over several Vulkan devices (lavapipe opened twice
stands in for two; a machine with one GPU, which tessera opens once, skips those cases) give the
same feature files as one device, read back with h5py: the same features bit for bit, the same
coords in the same order, the same attributes; every device takes at least one slide; a run
SIGKILLed part way and rerun with `--devices 0,0` equals an uninterrupted one-device run;
`--shard` composes with `--devices`; impossible device flags exit 2 naming the flag."""
import os
import shutil
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

from data_tools import replica_devices, run, summary, synth, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SIZE = 32
# Width, height, seed: slides of different tile counts, so that the devices finish at different times.
SLIDES = {"a": (512, 384, 3), "b": (640, 448, 4), "c": (384, 320, 5), "d": (576, 512, 6), "e": (448, 384, 7)}


def extract(store, out, *flags, check=True):
    result = run(TESSERA, "extract", "--model", "small-cnn", "--random-weights", "--layer", "pool2", "--tiles",
                 *store, "--out", out, *flags, check=check, env=dict(os.environ, TESSERA_VALIDATION="1"))
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    return result


def read_file(path):
    with h5py.File(path, "r") as f:
        return {"features": f["features"][:], "coords": f["coords"][:],
                "coords_attrs": {k: np.asarray(v).tolist() for k, v in f["coords"].attrs.items()},
                "features_attrs": {k: np.asarray(v).tolist() for k, v in f["features"].attrs.items()}}


def assert_same_files(out, expected, names):
    assert sorted(n for n in os.listdir(out) if n.endswith(".h5")) == sorted(n + ".h5" for n in names), os.listdir(out)
    assert not [n for n in os.listdir(out) if "partial" in n], os.listdir(out)
    for name in names:
        got, want = read_file(os.path.join(out, name + ".h5")), read_file(os.path.join(expected, name + ".h5"))
        assert got["features"].dtype == want["features"].dtype and got["features"].shape == want["features"].shape
        assert len(got["coords"]) > 0, name
        assert np.array_equal(got["features"], want["features"]), name
        assert got["coords"].tolist() == want["coords"].tolist(), name
        assert got["coords_attrs"] == want["coords_attrs"] and got["features_attrs"] == want["features_attrs"], name


@pytest.fixture(scope="module")
def stores():
    """Two tile stores (the slides split over them) and the one-device features of all slides."""
    work = workdir("extract_devices")
    paths = {}
    for name, (width, height, seed) in SLIDES.items():
        paths[name] = os.path.join(work, name + ".tiff")
        synth(TESSERA, paths[name], width, height, seed)
    first, second = os.path.join(work, "first.lmdb"), os.path.join(work, "second.lmdb")
    run(TESSERA, "tile", paths["a"], paths["b"], paths["c"], "--out", first, "--size", SIZE, "--encoding", "raw")
    run(TESSERA, "tile", paths["d"], paths["e"], "--out", second, "--size", SIZE, "--encoding", "raw")
    one = os.path.join(work, "one")
    result = summary(extract([first, second], one, "--device", 0, "--batch", 4))
    assert len(result["devices"]) == 1 and result["tiles"] == sum(s["tiles"] for s in result["slides"]), result
    yield work, [first, second], one
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def two():
    """The --devices value for two replicas on this machine (data_tools.replica_devices)."""
    return replica_devices(TESSERA)


def test_two_devices_equal_one(two, stores):
    work, store, one = stores
    out = os.path.join(work, "two")
    result = summary(extract(store, out, "--devices", two, "--batch", 4))
    assert_same_files(out, one, SLIDES)
    # One report for the run: every slide once, in the slides' order, and each device took some.
    assert [s["slide"] for s in result["slides"]] == sorted(SLIDES), result["slides"]
    assert all(s["status"] == "extracted" for s in result["slides"]), result["slides"]
    devices = result["devices"]
    assert len(devices) == 2 and all(d["slides"] >= 1 for d in devices), devices
    assert sum(d["slides"] for d in devices) == len(SLIDES), devices
    assert sum(d["tiles"] for d in devices) == result["tiles"] == sum(s["tiles"] for s in result["slides"]), result
    assert {s["device"] for s in result["slides"]} == {0, 1}, result["slides"]
    # A rerun finds every file complete.
    again = summary(extract(store, out, "--devices", two))
    assert all(s["status"] == "already complete" for s in again["slides"]) and again["tiles"] == 0, again


def test_shard_with_devices(two, stores):
    work, store, one = stores
    out = os.path.join(work, "shard")
    written = set()
    for index in range(2):
        result = summary(extract(store, out, "--devices", two, "--shard", f"{index}/2", "--batch", 4))
        mine = {s["slide"] for s in result["slides"]}
        assert mine and not mine & written, (mine, written)
        written |= mine
    assert written == set(SLIDES)
    assert_same_files(out, one, SLIDES)


def flushed_rows(out):
    rows = 0
    for name in os.listdir(out) if os.path.isdir(out) else []:
        try:
            if name.endswith(".rows"):
                with open(os.path.join(out, name)) as f:
                    rows += int(f.read() or 0)
            elif name.endswith(".h5"):
                rows += 1
        except (OSError, ValueError):
            pass
    return rows


def test_killed_run_resumes_on_two_devices(two, stores):
    work, store, one = stores
    out = os.path.join(work, "killed")
    command = [TESSERA, "extract", "--model", "small-cnn", "--random-weights", "--layer", "pool2", "--tiles", *store,
               "--out", out, "--batch", "1", "--devices", two]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while process.poll() is None and flushed_rows(out) < 6:
        time.sleep(0.002)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = [n for n in os.listdir(out) if n.endswith(".h5.partial")]
    assert partial, os.listdir(out)
    result = summary(extract(store, out, "--devices", two, "--batch", 3))
    statuses = [s["status"] for s in result["slides"]]
    assert "resumed" in statuses or "already complete" in statuses, statuses
    assert_same_files(out, one, SLIDES)


@pytest.mark.parametrize("flags, words", [
    (["--device", "0", "--devices", "0"], ["--device", "--devices"]),
    (["--devices", "0,7"], ["--devices", "no device 7"]),
    (["--devices=-1"], ["--devices", "no device -1"]),
    (["--devices", "0,x"], ["--devices"]),
])
def test_impossible_devices_refused(stores, flags, words):
    work, store, _ = stores
    out = os.path.join(work, "refused")
    result = extract(store, out, *flags, check=False)
    assert result.returncode == 2, (flags, result.returncode, result.stderr)
    for word in words:
        assert word in result.stderr, (flags, word, result.stderr)
    assert not os.path.exists(out) or not os.listdir(out), os.listdir(out)
