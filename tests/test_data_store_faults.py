"""Faults a lab meets with a tile store: a truncated data.mdb (exit 5 for train, extract and
tile, never a signal), two `tile` runs on one store (the second refuses at once, the store stays
intact), a slide file replaced at the same path (refused, never mixed), and training on a store
whose slide is not completely tiled (refused, saying so). Read back with python3-lmdb."""
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time

import lmdb

from data_tools import holds_flock, read_store, run, summary, synth, workdir

TILE_FLAGS = ["--size", "128", "--workers", "1", "--commit-tiles", "16"]


def expect(result, code, *words):
    assert result.returncode == code, (result.returncode, code, result.stderr)
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def tiles_of(store, slide_id):
    tiles, _ = read_store(store)
    return {key[1:]: value for key, value in tiles.items() if key[0] == slide_id}


def limit_file_size(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


def main(binary):
    work = workdir("test_data_store_faults")
    first, second, third = (os.path.join(work, f"slide{i}.tiff") for i in range(3))
    for seed, path in enumerate((first, second, third)):
        synth(binary, path, 2048, 2048, 50 + seed)
    references = {}
    for path in (first, second):
        references[path] = os.path.join(work, os.path.basename(path) + ".lmdb")
        run(binary, "tile", path, "--out", references[path], *TILE_FLAGS)

    # A truncated data.mdb: exit 5 naming it, for every command that opens the store.
    truncated = os.path.join(work, "truncated.lmdb")
    shutil.copytree(references[first], truncated)
    size = os.path.getsize(os.path.join(truncated, "data.mdb"))
    os.truncate(os.path.join(truncated, "data.mdb"), size // 2)
    for command in (["train", "--data", truncated, "--model", "small-cnn", "--epochs", "1", "--batch", "4"],
                    ["extract", "--model", "small-cnn", "--random-weights", "--layer", "conv1", "--tiles", truncated, "--out",
                     os.path.join(work, "features")],
                    ["tile", first, "--out", truncated]):
        expect(run(binary, *command, check=False), 5, "truncated.lmdb/data.mdb: truncated")

    # A corrupt page (the tiles database's root zeroed): an error naming the store, not an early
    # end of the data (train used to see 0 tiles; extract, a short feature file).
    corrupt = os.path.join(work, "corrupt.lmdb")
    shutil.copytree(references[first], corrupt)
    env = lmdb.open(corrupt, readonly=True, lock=False, max_dbs=2)
    with env.begin() as txn:
        record = txn.get(b"tiles")  # the main database's MDB_db record of `tiles`; root page at byte 40
    env.close()
    (root,) = struct.unpack_from("<Q", record, 40)
    with open(os.path.join(corrupt, "data.mdb"), "r+b") as f:
        f.seek(root * 4096)
        f.write(bytes(4096))
    for command in (["train", "--data", corrupt, "--model", "small-cnn", "--epochs", "1", "--batch", "4"],
                    ["extract", "--model", "small-cnn", "--random-weights", "--layer", "conv1", "--batch", "4", "--tiles", corrupt,
                     "--out", os.path.join(work, "corrupt-features")]):
        expect(run(binary, *command, check=False), 5, "corrupt.lmdb")
    assert not [name for name in os.listdir(os.path.join(work, "corrupt-features")) if name.endswith(".h5")]

    # Two writers: the first blocks on LMDB's writer lock, held here, after taking the store's
    # lock; the second must refuse at once, naming the store, and leave it alone.
    shared = os.path.join(work, "shared.lmdb")
    run(binary, "tile", first, "--out", shared, *TILE_FLAGS)
    env = lmdb.open(shared, max_dbs=2)
    blocker = env.begin(write=True)
    writer = subprocess.Popen([binary, "tile", second, "--out", shared, *TILE_FLAGS], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    lock = os.path.join(work, ".shared.lmdb.lock")
    while not holds_flock(writer.pid, lock):
        assert writer.poll() is None, writer.communicate()
        time.sleep(0.01)
    refused = run(binary, "tile", third, "--out", shared, *TILE_FLAGS, check=False)
    expect(refused, 1, "shared.lmdb", "in use")
    blocker.abort()
    env.close()
    out, err = writer.communicate()
    assert writer.returncode == 0, err
    _, slides = read_store(shared)
    assert sorted(slides) == [0, 1] and all(entry["complete"] for entry in slides.values()), slides
    assert slides[1]["path"] == os.path.abspath(second)
    assert tiles_of(shared, 0) == tiles_of(references[first], 0)
    assert tiles_of(shared, 1) == tiles_of(references[second], 0)
    print(f"second writer refused: {refused.stderr.strip().splitlines()[-1]}")

    # A slide replaced at the same path, after a run stopped by a full disk: refused, not mixed.
    moving = os.path.join(work, "moving.tiff")
    shutil.copy(first, moving)
    partial = os.path.join(work, "partial.lmdb")
    stopped = run(binary, "tile", moving, "--out", partial, *TILE_FLAGS, check=False,
                  preexec_fn=limit_file_size(256 << 10))
    assert stopped.returncode == 1 and "disk is full" in stopped.stderr, stopped.stderr
    before, slides = read_store(partial)
    assert 0 < len(before) and not slides[0]["complete"], (len(before), slides)
    expect(run(binary, "train", "--data", partial, "--model", "small-cnn", "--epochs", "1", "--batch", "4",
               check=False), 5, "partial.lmdb", "not completely tiled")
    shutil.copy(second, moving)
    expect(run(binary, "tile", moving, "--out", partial, *TILE_FLAGS, check=False), 5, "moving.tiff",
           "changed")
    assert read_store(partial) == (before, slides), "the store is unchanged"
    # The slide moved back: the run resumes and ends as one uninterrupted run would.
    shutil.copy(first, moving)
    run(binary, "tile", moving, "--out", partial, *TILE_FLAGS)
    assert tiles_of(partial, 0) == tiles_of(references[first], 0)
    # Complete, then replaced: refused too.
    shutil.copy(third, moving)
    expect(run(binary, "tile", moving, "--out", partial, *TILE_FLAGS, check=False), 5, "moving.tiff", "changed")
    shutil.rmtree(work)
    print("ok")


def test_data_store_faults():
    main(TESSERA)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else TESSERA)
