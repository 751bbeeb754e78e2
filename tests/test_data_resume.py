"""A killed `tessera synth` leaves nothing at its output paths. A killed `tessera tile` run, and one
stopped by a full disk, resume to exactly the tiles of an uninterrupted run (byte for byte, read
with python3-lmdb)."""
import fcntl
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import lmdb

from data_tools import parse_value, read_store, run, summary, synth, workdir

# Re-encoded 128-pixel tiles, one worker and small transactions: slow enough to kill midway.
TILE_FLAGS = ["--size", "128", "--workers", "1", "--commit-tiles", "16", "--quality", "80", "--unannotated", "Normal"]


TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")

def tile_count(store):
    try:
        env = lmdb.open(store, readonly=True, max_dbs=2)
    except lmdb.Error:
        return 0
    try:
        with env.begin() as txn:
            return txn.stat(env.open_db(b"tiles", txn=txn, create=False))["entries"]
    except lmdb.Error:
        return 0
    finally:
        env.close()


def kill_after(binary, slide, labels, store, at_least):
    """Starts a run and kills it (SIGKILL) once the store holds `at_least` tiles; returns that count."""
    process = subprocess.Popen([binary, "tile", slide, "--out", store, "--labels", labels, *TILE_FLAGS],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while process.poll() is None:
        count = tile_count(store)
        if count >= at_least:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return count
        time.sleep(0.002)
    raise AssertionError(f"the run ended (exit {process.returncode}) before it could be killed")


def limit_file_size(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def assert_same_store(a, b):
    tiles_a, slides_a = read_store(a)
    tiles_b, slides_b = read_store(b)
    assert tiles_a.keys() == tiles_b.keys(), (len(tiles_a), len(tiles_b))
    different = [key for key in tiles_a if tiles_a[key] != tiles_b[key]]
    assert not different, f"{len(different)} tiles differ, first {different[:3]}"
    assert slides_a == slides_b, (slides_a, slides_b)
    for key, value in tiles_b.items():
        parse_value(key, value)
    return len(tiles_a)


def killed_synth_leaves_nothing(binary, work):
    """A synth run killed after it began writing leaves no file at its output paths. Sync point:
    its stderr is a full pipe, so it blocks on its first progress line (at latest when the slide
    is written, before the ground truth and any rename) and cannot finish before the kill."""
    slide = os.path.join(work, "killed.tiff")
    outputs = [slide, os.path.join(work, "killed.mask.tiff"), os.path.join(work, "killed.geojson")]
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    process = subprocess.Popen([binary, "synth", slide, "--width", "4096", "--height", "4096", "--seed", "5"],
                               stdout=subprocess.DEVNULL, stderr=write_end)
    while not any(os.path.exists(path) for path in [slide, slide + ".partial"]):
        assert process.poll() is None, process.returncode
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    os.close(read_end)
    os.close(write_end)
    left = [path for path in outputs if os.path.exists(path)]
    assert not left, f"a killed synth left {left}"
    made = synth(binary, slide, 4096, 4096, 5)
    assert all(os.path.exists(path) for path in outputs) and not os.path.exists(slide + ".partial"), made
    print("killed synth: nothing at its output paths; run again, it completes")


def main(binary):
    work = workdir("test_data_resume")
    killed_synth_leaves_nothing(binary, work)
    slide = os.path.join(work, "slide.tiff")
    labels = os.path.join(work, "slide.geojson")
    synth(binary, slide, 4096, 4096, 31)

    reference = os.path.join(work, "reference.lmdb")
    complete = summary(run(binary, "tile", slide, "--out", reference, "--labels", labels, *TILE_FLAGS))
    total = complete["written"]
    assert total > 150, total

    killed = os.path.join(work, "killed.lmdb")
    first = kill_after(binary, slide, labels, killed, 16)
    second = kill_after(binary, slide, labels, killed, total // 2)
    assert 0 < first < second < total, (first, second, total)
    resumed = summary(run(binary, "tile", slide, "--out", killed, "--labels", labels, *TILE_FLAGS))
    assert resumed["slides"][0]["status"] == "resumed" and resumed["slides"][0]["resumed_from"] >= second
    count = assert_same_store(reference, killed)
    print(f"killed at {first} and {second} of {total} tiles; resumed store identical ({count} tiles)")

    full = os.path.join(work, "full.lmdb")
    limit = 1 << 20
    stopped = run(binary, "tile", slide, "--out", full, "--labels", labels, *TILE_FLAGS, check=False,
                  preexec_fn=limit_file_size(limit))
    assert stopped.returncode == 1, (stopped.returncode, stopped.stderr)
    assert "disk is full" in stopped.stderr and "full.lmdb" in stopped.stderr, stopped.stderr
    kept, _ = read_store(full)
    for key, value in kept.items():
        parse_value(key, value)
    assert 0 < len(kept) < total, len(kept)
    print(f"full disk after {len(kept)} tiles: {stopped.stderr.strip().splitlines()[-1]}")
    run(binary, "tile", slide, "--out", full, "--labels", labels, *TILE_FLAGS)
    assert_same_store(reference, full)

    again = summary(run(binary, "tile", slide, "--out", full, "--labels", labels, *TILE_FLAGS))
    assert again["slides"][0]["status"] == "already complete" and again["written"] == 0
    shutil.rmtree(work)
    print("ok")


def test_data_resume():
    main(TESSERA)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else TESSERA)
