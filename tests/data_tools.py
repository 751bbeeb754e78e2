"""Shared helpers of the tests/test_data_*.py scripts: run tessera, read a tile store with
python3-lmdb and nothing of tessera's (an independent reader of the format in docs/architecture.md)."""
import atexit
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import zlib

import pytest
from PIL import Image

HEADER = struct.Struct("<BBBBHHIIIII")


def run(binary, *args, check=True, **kwargs):
    result = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"tessera {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr}")
    return result


def run_with_report(binary, args, check=True, env=None):
    """Runs tessera; (exit code, stdout, stderr, report lines from --report-fd for train)."""
    read_end, write_end = os.pipe()
    command = [binary, *map(str, args)] + (["--report-fd", str(write_end)] if args[0] == "train" else [])
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_end,),
                               env=env, text=True)
    os.close(write_end)
    with os.fdopen(read_end) as report:
        lines = [json.loads(line) for line in report if line.strip()]
    out, err = process.communicate()
    if check and process.returncode != 0:
        raise AssertionError(f"{command} exited {process.returncode}:\n{err}")
    return process.returncode, out, err, lines


def summary(result):
    """The JSON summary a command prints as its last stdout line."""
    return json.loads(result.stdout.strip().splitlines()[-1])


def devices(binary):
    """The Vulkan devices tessera sees, as `tessera info --json` lists them (index, name, type...)."""
    return json.loads(run(binary, "info", "--json").stdout)["devices"]


def on_host_cores(device):
    """Whether a device runs on the CPU: a CPU device, or lavapipe presented as a discrete GPU by
    tests/support/discrete_gpu (compute/vk/context.cpp's host_cores: type CPU or llvmpipe's driver)."""
    return device["type"] == "cpu" or device["driver"].startswith("llvmpipe")


def replica_devices(binary):
    """--devices for a run on two replicas: two devices of one name where the machine has them,
    else device 0 twice where it runs on the CPU (lavapipe may be opened twice; tessera opens a GPU
    once, by design), else pytest skips the caller (one GPU)."""
    listed = devices(binary)
    alike = [d["index"] for d in listed if d["name"] == listed[0]["name"]]
    if len(alike) >= 2:
        return f"{alike[0]},{alike[1]}"
    if on_host_cores(listed[0]):
        return "0,0"
    pytest.skip(f"two replicas need two alike devices or a CPU device opened twice: device 0 is a "
                f"{listed[0]['type']} ({listed[0]['name']}), which tessera opens once, and no other device is alike")


def patch_task(path, count, size, seed=1):
    """A PCam-layout patch file from tools/make_patch_task.py."""
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "make_patch_task.py")
    subprocess.run([sys.executable, tool, "--out", str(path), "--count", str(count), "--size", str(size),
                    "--seed", str(seed)], check=True, capture_output=True)
    return path


def synth(binary, path, width, height, seed, *flags):
    return summary(run(binary, "synth", path, "--width", width, "--height", height, "--seed", seed, *flags))


def synth_raw_store(binary, work, slides, size):
    """WORK/NAME.tiff for each NAME: (width, height, seed) of `slides`, tiled in that order into
    WORK/tiles.lmdb at `size` with raw pixels; the store's path."""
    paths = [os.path.join(work, name + ".tiff") for name in slides]
    for path, (width, height, seed) in zip(paths, slides.values()):
        synth(binary, path, width, height, seed)
    store = os.path.join(work, "tiles.lmdb")
    run(binary, "tile", *paths, "--out", store, "--size", size, "--encoding", "raw")
    return store


def read_store(path):
    """(tiles, slides): tiles maps key tuples (slide, level, row, column) to value bytes."""
    # Imported here, so that the tests that never open a store run where python3-lmdb is not
    # installed (the GPU machine's Python); those that do are skipped there with the reason.
    lmdb = pytest.importorskip("lmdb", reason="python3-lmdb, the independent reader of tile stores, is not installed")
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=2)
    tiles_db = env.open_db(b"tiles", create=False)
    slides_db = env.open_db(b"slides", create=False)
    tiles, slides = {}, {}
    with env.begin() as txn:
        for key, value in txn.cursor(db=tiles_db):
            assert len(key) == 16, key
            tiles[struct.unpack(">IIII", key)] = bytes(value)
        for key, value in txn.cursor(db=slides_db):
            slides[struct.unpack(">I", key)[0]] = json.loads(bytes(value))
    env.close()
    return tiles, slides


def parse_value(key, value):
    """Header fields and pixels (H x W x 3 bytes as a PIL image) of a verified value."""
    version, encoding, channels, _, width, height, label, x, y, size, crc = HEADER.unpack_from(value)
    assert version == 1 and channels == 3, (key, version, channels)
    assert size == len(value) - HEADER.size, key
    assert zlib.crc32(value[:24] + value[28:]) == crc, f"checksum of {key}"
    pixels = value[28:]
    if encoding == 1:
        image = Image.open(io.BytesIO(pixels))
        image.load()
        image = image.convert("RGB")
    else:
        image = Image.frombytes("RGB", (width, height), pixels)
    assert image.size == (width, height), key
    return {"label": label, "x": x, "y": y, "width": width, "height": height, "encoding": encoding, "image": image}


def point_in_polygons(x, y, polygons):
    """Even-odd rule over each polygon's rings; True inside any polygon."""
    for rings in polygons:
        inside = False
        for ring in rings:
            for (x1, y1), (x2, y2) in zip(ring, ring[1:] + ring[:1]):
                if (y1 > y) != (y2 > y) and x < (x2 - x1) * (y - y1) / (y2 - y1) + x1:
                    inside = not inside
        if inside:
            return True
    return False


def tumour_polygons(geojson_path):
    with open(geojson_path) as f:
        document = json.load(f)
    polygons = []
    for feature in document["features"]:
        if feature["properties"]["classification"]["name"] != "Tumor":
            continue
        geometry = feature["geometry"]
        if geometry["type"] == "Polygon":
            polygons.append(geometry["coordinates"])
        else:
            polygons.extend(geometry["coordinates"])
    return polygons


def holds_flock(pid, path):
    """Whether process `pid` holds a flock on `path` (from /proc/locks, without taking the lock); the
    lock file exists only while a run holds it."""
    if not os.path.exists(path):
        return False
    inode = os.stat(path).st_ino
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if fields[1] == "FLOCK" and int(fields[4]) == pid and int(fields[5].split(":")[-1]) == inode:
                return True
    return False


def workdir(name):
    """A scratch directory of this test process, removed as the process exits."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tessera_{name}_{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# Under AddressSanitizer (tools/sanitize-tests.sh sets TESSERA_SANITIZED) shadow memory, redzones
# and the allocator's quarantine add a few hundred MiB to every process: memory ceilings are the
# plain run's to check.
SANITIZED = bool(os.environ.get("TESSERA_SANITIZED"))


def within_memory(peak, ceiling):
    """Whether a process's peak resident bytes are under `ceiling` (always, under the sanitizers)."""
    return SANITIZED or peak < ceiling


def run_with_usage(command, timeout):
    """Runs `command`; (exit code, negative for a signal, stdout, stderr, peak resident bytes of the
    process and the children it waited for, CPU seconds, killed at `timeout` seconds)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen([str(part) for part in command], stdout=out, stderr=err)
        killed = threading.Event()
        timer = threading.Timer(timeout, lambda: (killed.set(), process.kill()))
        timer.start()
        _, status, usage = os.wait4(process.pid, 0)
        timer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (process.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, killed.is_set())
