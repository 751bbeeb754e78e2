"""python/tessera/tile_store.py (the PyTorch reader of tile stores) against tessera's own loader on
the same stores (tests/dump_loader.cpp: an unshuffled epoch of data::Loader, the patches' groups
and validation split, each slide's tiles as TileStore reads them, and each slide's record):
- JPEG tiles in two shard stores read as a directory, and raw tiles in one store: every tile's
  pixels (exactly), label, slide rank, in tessera's order; level-0 coordinates and labels as the
  store's headers give them; every tile once; the same class count and --val-fraction split.
- Every slide entry `tessera tile` wrote is its own SlideRecord to_json, in Python and in C++.
- Through torch's DataLoader with two worker processes (stores reopened after the fork), batches
  equal the loader's; without torch, the module imports and reads.
- A corrupt tile is an error naming the tile in both readers; an incompletely tiled slide too.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from data_tools import run, synth, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
DUMP = os.environ.get("TESSERA_DUMP_LOADER", "build/tests/dump_loader")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from tessera.slide_record import read_slide_entry  # noqa: E402
from tessera.tile_store import TileStoreDataset, TileStoreError  # noqa: E402

TILE, FRACTION = 64, 0.3


@pytest.fixture(scope="module")
def work():
    path = workdir("test_python_tile_store")
    slides = []
    for index in range(3):
        slide = os.path.join(path, f"slide{index}.tiff")
        synth(TESSERA, slide, 2048, 1536, 40 + index)  # two levels: 2048 and 1024 pixels wide
        slides.append(slide)
    labels = [s.replace(".tiff", ".geojson") for s in slides]
    common = ["--labels", *labels, "--unannotated", "Normal", "--size", TILE, "--allow-empty-labels", "--workers", 2]
    os.makedirs(os.path.join(path, "shards"))
    for shard in range(2):  # JPEG (the default) in two stores, read as their directory
        run(TESSERA, "tile", *slides, "--out", os.path.join(path, "shards", f"part{shard}.lmdb"), *common,
            "--shard", f"{shard}/2")
    run(TESSERA, "tile", *slides, "--out", os.path.join(path, "raw.lmdb"), *common, "--encoding", "raw", "--level", 1)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dump(work, name, *stores):
    """What tessera's loader yields for `stores`."""
    out = os.path.join(work, "dump_" + name)
    os.makedirs(out, exist_ok=True)
    result = subprocess.run([DUMP, out, str(FRACTION), *stores], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with open(os.path.join(out, "split.json")) as f:
        meta = json.load(f)
    count = meta["count"]
    with open(os.path.join(out, "tiles.jsonl")) as f:
        tiles = [json.loads(line) for line in f]
    with open(os.path.join(out, "records.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return {"meta": meta, "tiles": tiles, "records": records,
            "pixels": np.fromfile(os.path.join(out, "pixels.u8"), np.uint8).reshape(count, meta["height"],
                                                                                     meta["width"], meta["channels"]),
            "labels": np.fromfile(os.path.join(out, "labels.u32"), np.uint32),
            "groups": np.fromfile(os.path.join(out, "groups.u64"), np.uint64)}


def check_equal(dataset, expected):
    meta = expected["meta"]
    assert len(dataset) == meta["count"] > 20
    assert dataset.class_count == meta["class_count"] == 2
    assert dataset.tile_size == meta["width"] == meta["height"]
    headers = {(t["slide_path"], t["level"], t["x"], t["y"]): t for t in expected["tiles"]}
    assert len(headers) == len(dataset)
    seen = set()
    for index in range(len(dataset)):
        item = dataset[index]
        assert item["image"].dtype == np.uint8 and item["image"].shape == (TILE, TILE, 3)
        assert item["image"].flags.writeable  # torch.as_tensor warns of read-only arrays
        assert np.array_equal(item["image"], expected["pixels"][index]), index
        assert item["label"] == expected["labels"][index], index
        assert item["slide_index"] == expected["groups"][index], index
        key = (item["slide"], item["level"], item["x"], item["y"])
        assert item["label"] == headers[key]["label"], key
        seen.add(key)
    assert seen == set(headers)
    # Both classes and several slides are present: the comparison is not of one uniform run.
    assert len(set(expected["labels"].tolist())) == 2 and len(set(expected["groups"].tolist())) == 3
    train, validation = dataset.validation_split(FRACTION)
    assert train.tolist() == meta["train"] and validation.tolist() == meta["validation"]
    assert 0 < len(validation) < len(dataset)
    check_records(expected["records"])


def check_records(records):
    """Each entry as `tile` wrote it equals SlideRecord's to_json of it, in Python and in C++."""
    assert records
    for line in records:
        env = lmdb.open(line["store"], readonly=True, max_dbs=2, lock=False)
        with env.begin() as txn:
            raw = bytes(txn.get(struct.pack(">I", line["slide"]), db=env.open_db(b"slides", txn=txn)))
        env.close()
        written = json.loads(raw)
        ours = read_slide_entry(raw, f"{line['store']}: slide {line['slide']}").to_json()
        canonical = [json.dumps(entry, sort_keys=True) for entry in (written, ours, line["record"])]
        assert canonical[0] == canonical[1] == canonical[2], line["slide"]


def test_jpeg_shards_equal_tessera_loader(work):
    shards = os.path.join(work, "shards")
    expected = dump(work, "shards", shards)
    dataset = TileStoreDataset(shards)
    assert len(dataset.stores) == 2
    check_equal(dataset, expected)
    # Level-0 coordinates: level-0 tiles lie on the grid of their row and column.
    item = dataset[len(dataset) // 2]
    assert (item["x"], item["y"]) == (item["column"] * TILE, item["row"] * TILE)


def test_raw_store_equal_tessera_loader(work):
    store = os.path.join(work, "raw.lmdb")
    dataset = TileStoreDataset(store)
    check_equal(dataset, dump(work, "raw", store))
    item = dataset[len(dataset) - 1]  # level 1: twice the level's pixels at level 0
    assert item["level"] == 1 and (item["x"], item["y"]) == (item["column"] * TILE * 2, item["row"] * TILE * 2)


def test_torch_data_loader_with_workers(work):
    torch = pytest.importorskip("torch")
    shards = os.path.join(work, "shards")
    expected = dump(work, "shards_torch", shards)
    dataset = TileStoreDataset(shards)
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, num_workers=2)
    for _ in range(3):  # each epoch forks workers while this process has its stores open
        assert np.array_equal(dataset[1]["image"], expected["pixels"][1])
        images, labels, slides = [], [], []
        for batch in loader:
            images.append(batch["image"].numpy())
            labels.append(batch["label"].numpy())
            slides.extend(batch["slide"])
        assert np.array_equal(np.concatenate(images), expected["pixels"])
        assert np.array_equal(np.concatenate(labels), expected["labels"])
        assert len(slides) == len(dataset) and all(s.endswith(".tiff") for s in slides)


def test_imports_and_reads_without_torch(work):
    store = os.path.join(work, "raw.lmdb")
    code = ("import json, sys; sys.modules['torch'] = None  # import torch raises ImportError\n"
            "from tessera.tile_store import TileStoreDataset\n"
            f"d = TileStoreDataset({store!r})\n"
            "print(json.dumps([len(d), d[0]['label'], type(d).__mro__[1].__name__]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert result.returncode == 0, result.stderr
    dataset = TileStoreDataset(store)
    assert json.loads(result.stdout) == [len(dataset), dataset[0]["label"], "object"]


def corrupted_copy(work, name, change):
    """A copy of the raw store with `change(txn, tiles_db, slides_db)` applied."""
    store = os.path.join(work, name)
    shutil.copytree(os.path.join(work, "raw.lmdb"), store)
    env = lmdb.open(store, max_dbs=2)
    with env.begin(write=True) as txn:
        change(txn, env.open_db(b"tiles", txn=txn), env.open_db(b"slides", txn=txn))
    env.close()
    return store


def refused_by_loader(work, store, words):
    out = os.path.join(work, "dump_" + os.path.basename(store))
    os.makedirs(out, exist_ok=True)
    result = subprocess.run([DUMP, out, str(FRACTION), store], capture_output=True, text=True)
    assert result.returncode != 0 and words in result.stderr, result.stderr


def test_corrupt_tile_and_incomplete_slide_named_by_both(work):
    def flip_a_pixel(txn, tiles, _):
        key, value = next(iter(txn.cursor(db=tiles)))
        value = bytearray(value)
        value[-1] ^= 0xFF
        txn.put(key, bytes(value), db=tiles)

    store = corrupted_copy(work, "corrupt.lmdb", flip_a_pixel)
    dataset = TileStoreDataset(store)  # the index holds; reading the tile fails
    with pytest.raises(TileStoreError, match=r"corrupt.lmdb tile slide \d+ level 1 row \d+ column \d+: checksum"):
        for index in range(len(dataset)):
            dataset[index]
    refused_by_loader(work, store, "checksum mismatch")

    unfinished = []

    def unfinish(txn, _, slides):
        key, value = next(iter(txn.cursor(db=slides)))
        entry = json.loads(bytes(value))
        entry["complete"] = False
        txn.put(key, json.dumps(entry).encode(), db=slides)
        unfinished.append(struct.unpack(">I", key)[0])

    store = corrupted_copy(work, "incomplete.lmdb", unfinish)
    with pytest.raises(TileStoreError, match=f"incomplete.lmdb: slide {unfinished[0]} .* is not completely tiled"):
        TileStoreDataset(store)
    refused_by_loader(work, store, "is not completely tiled")
