"""What `tessera train` reads, checked before it trains: patch files whose pixels lie outside 0-255
or whose rows hold no data, labels of one class, tile labels their slide does not count; and the
validation split, which holds out whole slides as close to --val-fraction as they allow and says
what it held out (slides, patches, classes, the patches each epoch leaves out)."""
import json
import os
import shutil
import struct
import zlib

import h5py
import lmdb
import numpy as np

from data_tools import run_with_report, run_with_usage, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SMALL = ["--model", "small-cnn", "--width", 4, "--batch", 8, "--epochs", 1, "--workers", 1, "--seed", 1]
MiB = 1 << 20


def train(*args, check=False):
    return run_with_report(TESSERA, ["train", *map(str, args)], check=check,
                           env=dict(os.environ, TESSERA_VALIDATION="1"))


def events(stderr, kind):
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == kind]


def patch_file(path, x, y):
    """x and y in chunks of 8 rows, Deflate-compressed (as PCam's files are stored)."""
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(8, *x.shape[1:]), compression="gzip")
        f.create_dataset("y", data=y, chunks=(8,))


def tile_value(label, x, y, pixels):
    """A raw tile value as docs/architecture.md's tile store format lays it out (CRC-32 over the header's
    first 24 bytes and the pixels)."""
    header = struct.pack("<BBBBHHIIII", 1, 0, 3, 0, 8, 8, label, x, y, len(pixels))
    return header + struct.pack("<I", zlib.crc32(header + pixels)) + pixels


def write_store(path, slides, tile_labels=None):
    """A tile store of 8x8 raw tiles written with python3-lmdb: `slides` lists each slide's tile
    labels; the slide entries count them, unless `tile_labels` gives other labels for the tiles."""
    env = lmdb.open(path, map_size=64 * MiB, max_dbs=2)
    tiles, entries = env.open_db(b"tiles"), env.open_db(b"slides")
    rng = np.random.default_rng(0)
    with env.begin(write=True) as txn:
        for slide, labels in enumerate(slides):
            counts = {}
            for index, label in enumerate(labels):
                counts[str(label)] = counts.get(str(label), 0) + 1
                stored = tile_labels[slide][index] if tile_labels else label
                pixels = rng.integers(0, 256, 8 * 8 * 3, dtype=np.uint8).tobytes()
                txn.put(struct.pack(">IIII", slide, 0, 0, index), tile_value(stored, index * 8, 0, pixels), db=tiles)
            entry = {"path": f"/slides/s{slide}.svs", "fingerprint": f"size:{slide} crc32:0:0", "tile_size": 8,
                     "tiles": len(labels), "corrupt_tiles": 0, "label_counts": counts, "complete": True}
            txn.put(struct.pack(">I", slide), json.dumps(entry).encode(), db=entries)
    env.close()


def test_patch_files():
    work = workdir("test_train_data_checks_patches")
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (32, 8, 8, 3)).astype(np.int16)
    y = np.array([0, 1] * 16, np.uint8)

    # int16 pixels are read as they are stored: in 0-255 they train, one at 300 names its row.
    good = os.path.join(work, "int16.h5")
    patch_file(good, x, y)
    train("--data", good, *SMALL, "--val-fraction", 0, check=True)
    x[21, 3, 5, 1] = 300
    wide = os.path.join(work, "int16-300.h5")
    patch_file(wide, x, y)
    code, _, err, _ = train("--data", wide, *SMALL, "--val-fraction", 0)
    assert code == 5 and wide in err and "patch (row) 21 holds 300" in err, (code, err)

    # Labels of one class: nothing to classify.
    one = os.path.join(work, "one-class.h5")
    patch_file(one, x.clip(0, 255).astype(np.uint8), np.zeros(32, np.uint8))
    code, _, err, _ = train("--data", one, *SMALL, "--dry-run")
    assert code == 5 and one in err and "every patch is of class 0" in err, (code, err)

    # 10^9 rows declared in 1.6 KB, chunked and never written: refused, in little memory.
    huge = os.path.join(work, "huge.h5")
    with h5py.File(huge, "w") as f:
        f.create_dataset("x", shape=(10**9, 96, 96, 3), dtype="u1", chunks=(1, 96, 96, 3))
        f.create_dataset("y", shape=(10**9,), dtype="u1", chunks=(1024,))
    assert os.path.getsize(huge) < 4096
    code, _, err, peak, _, killed = run_with_usage([TESSERA, "train", "--data", huge, "--dry-run"], timeout=600)
    assert code == 5 and not killed and huge in err and "chunks hold data" in err, (code, err)
    assert peak < 256 * MiB, peak
    shutil.rmtree(work)


def test_tile_store_labels_and_split():
    work = workdir("test_train_data_checks_store")

    # A tile whose label its slide's entry does not count: exit 5 naming the tile, not "diverged".
    edited = os.path.join(work, "edited.lmdb")
    slides = [[0, 1] * 10, [0, 1] * 10]
    write_store(edited, slides, [[0, 1] * 9 + [0, 7], [0, 1] * 10])
    code, _, err, _ = train("--data", edited, *SMALL, "--val-fraction", 0)
    assert code == 5 and "slide 0 level 0 row 0 column 19" in err and "label 7" in err, (code, err)

    # Two slides, 82% and 18% of the tiles: --val-fraction 0.1 holds out the small one (it held
    # out the large one, all of one class, before), and says so.
    two = os.path.join(work, "two.lmdb")
    write_store(two, [[0, 1] * 41, [0] * 18])
    code, _, err, report = train("--data", two, *SMALL, "--val-fraction", 0.1)
    assert code == 0, err
    split, = events(err, "split")
    assert split["held_out_slides"] == ["/slides/s1.svs"], split
    assert split["held_out_fraction"] == 0.18 and split["validation"]["per_class"] == [18], split
    assert split["train"] == {"patches": 82, "slides": 1, "per_class": [41, 41]}, split
    # 82 training tiles in batches of 8: 80 a step, 2 left out each epoch (a different 2, reshuffled).
    assert split["train_patches_per_epoch"] == 80 and split["dropped_per_epoch"] == 2, split
    assert any("no patch of class 1" in line.get("warning", "") for line in map(json.loads, filter(
        lambda line: line.startswith("{"), err.splitlines()))), err
    final, = [line for line in report if line["type"] == "final"]
    assert final["metrics"]["split"]["held_out_fraction"] == 0.18, final

    # Two equal slides: the nearest split at 0.1 is none; refused, naming the flag and the way out.
    equal = os.path.join(work, "equal.lmdb")
    write_store(equal, [[0, 1] * 10, [0, 1] * 10])
    code, _, err, _ = train("--data", equal, *SMALL, "--val-fraction", 0.1)
    assert code == 2 and "--val-fraction 0.1 holds out nothing" in err and "--val-fraction 0" in err, (code, err)
    train("--data", equal, *SMALL, "--val-fraction", 0.5, check=True)

    # Every tile of class 1 on the slide validation would take: training would never see it.
    lopsided = os.path.join(work, "lopsided.lmdb")
    write_store(lopsided, [[0] * 40, [0] * 40, [1] * 20])
    code, _, err, _ = train("--data", lopsided, *SMALL, "--val-fraction", 0.2)
    assert code == 2 and "class 1" in err and "training would never see it" in err, (code, err)
    shutil.rmtree(work)


def test_mil_split():
    """Six slides at --val-fraction 0.1 held out none; now the one slide 0.1 comes nearest to."""
    work = workdir("test_train_data_checks_mil")
    features = os.path.join(work, "features")
    os.makedirs(features)
    rng = np.random.default_rng(2)
    rows = ["slide,label"]
    for s in range(6):
        with h5py.File(os.path.join(features, f"s{s}.h5"), "w") as f:
            f["features"] = rng.normal(size=(5, 4)).astype(np.float32)
        rows.append(f"s{s},{s % 2}")
    labels = os.path.join(work, "labels.csv")
    with open(labels, "w") as f:
        f.write("\n".join(rows) + "\n")
    code, _, err, report = train("--features", features, "--labels", labels, "--epochs", 1, "--val-fraction", 0.1)
    assert code == 0, err
    split, = events(err, "split")
    assert split["validation"]["slides"] == 1 and split["train"]["slides"] == 5, split
    assert len(split["held_out_slides"]) == 1 and "its AUC is undefined" in split["warnings"][0], split
    final, = [line for line in report if line["type"] == "final"]
    assert final["metrics"]["val_slides"] == 1, final
    code, _, err, _ = train("--features", features, "--labels", labels, "--epochs", 1, "--val-fraction", 0.05)
    assert code == 2 and "holds out none" in err, (code, err)
    shutil.rmtree(work)
