"""python/tessera/slide_record.py (a tile store's slide entry as a typed record) against tessera's
SlideRecord (data/slide_record.h), on stores written here with python3-lmdb alone (no tessera
binary; tests/dump_loader.cpp, built with tessera's data library, is the C++ side):
- An entry of an old store (no rgb, fingerprint, name or grid) reads with the documented
  defaults; an entry of a tile size alone takes every default; 4 channels without rgb are planes.
- Malformed entries (a string width, a negative tile_size, label_counts naming "x" or not adding
  up to the tiles, rgb true for 5 channels, an intensity window [9, 3], more tiles, corrupt and
  unannotated candidates than candidates, even where their sum wraps around 64 bits, a negative
  unannotated count, text that is not JSON) are refused by the dataset with the message tessera
  gives, word for word: "STORE: slide ID: slide entry: FIELD ..." (for text that is not JSON, its
  start: the parsers' own words follow). JSON tessera does not read (NaN, a number beyond a
  double, a key given twice, nesting deeper than 64 levels, 100000 too) is refused alike by both.
- to_json(from_json(entry)) equals tessera's SlideRecord::to_json of the same entry, for full,
  old, bare and multiplex entries; a full entry is its own to_json.
- A 5-channel, 16-bit multiplex store (raw tiles at level 1) reads as height x width x 5, equal to
  tessera's loader pixel for pixel, with its labels, origins and slide ranks; stores of 5 and 3
  channels are refused together by both; a JPEG tile of 5 channels is refused.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import lmdb
import numpy as np
import pytest

from data_tools import HEADER, workdir

DUMP = os.environ.get("TESSERA_DUMP_LOADER", "build/tests/dump_loader")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from tessera.slide_record import SlideRecord, read_slide_entry  # noqa: E402
from tessera.tile_store import TileStoreDataset, TileStoreError, parse_tile  # noqa: E402

TILE = 8


@pytest.fixture(scope="module")
def work():
    path = workdir("test_python_slide_record")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tile_value(pixels, label, x, y, encoding=0):
    """A tile value as tessera writes it (data/tile_format.h): header, then the pixels."""
    height, width, channels = pixels.shape
    data = pixels.tobytes()
    header = HEADER.pack(1, encoding, channels, 0, width, height, label, x, y, len(data), 0)
    crc = zlib.crc32(data, zlib.crc32(header[:24]))
    return header[:24] + struct.pack("<I", crc) + data


def grid_tiles(slide_id, record, labels, seed):
    """Raw tiles along row 0 of `record`'s grid with these labels: {key: (value, pixels)}."""
    rng = np.random.default_rng(seed)
    tiles = {}
    for column, label in enumerate(labels):
        pixels = rng.integers(0, 256, (TILE, TILE, record.channels), dtype=np.uint8)
        key = struct.pack(">IIII", slide_id, record.level, 0, column)
        tiles[key] = (tile_value(pixels, label, record.tile_x(column), record.tile_y(0)), pixels)
    return tiles


def values_of(tiles):
    """What the store holds of grid_tiles' tiles: {key: value}."""
    return {key: value for key, (value, _) in tiles.items()}


def write_store(path, entries, tiles=()):
    """A store of `entries` ({slide id: entry dict, or bytes as stored}) and `tiles` ({key: value})."""
    shutil.rmtree(path, ignore_errors=True)
    env = lmdb.open(path, max_dbs=2)
    tiles_db, slides_db = env.open_db(b"tiles"), env.open_db(b"slides")
    with env.begin(write=True) as txn:
        for key, value in dict(tiles).items():
            txn.put(key, value, db=tiles_db)
        for slide_id, entry in entries.items():
            text = entry if isinstance(entry, bytes) else json.dumps(entry).encode()
            txn.put(struct.pack(">I", slide_id), text, db=slides_db)
    env.close()
    return path


def dump(work, name, *stores):
    """tessera's loader over `stores`: (exit code, stderr, what it wrote)."""
    out = os.path.join(work, "dump_" + name)
    os.makedirs(out, exist_ok=True)
    result = subprocess.run([DUMP, out, "0", *stores], capture_output=True, text=True)  # no split: not compared here
    if result.returncode != 0:
        return result.returncode, result.stderr, None
    with open(os.path.join(out, "split.json")) as f:
        meta = json.load(f)
    with open(os.path.join(out, "records.jsonl")) as f:
        records = [json.loads(line) for line in f]
    with open(os.path.join(out, "tiles.jsonl")) as f:
        tiles = [json.loads(line) for line in f]
    shape = (meta["count"], meta["height"], meta["width"], meta["channels"])
    return 0, result.stderr, {"meta": meta, "records": records, "tiles": tiles,
                              "pixels": np.fromfile(os.path.join(out, "pixels.u8"), np.uint8).reshape(shape),
                              "labels": np.fromfile(os.path.join(out, "labels.u32"), np.uint32),
                              "groups": np.fromfile(os.path.join(out, "groups.u64"), np.uint64)}


def canonical(entry):
    """JSON text that tells 1 from 1.0 and ignores key order."""
    return json.dumps(entry, sort_keys=True)


# An RGB slide as `tessera tile` writes it now: every field.
FULL = {"path": "/slides/case 1.svs", "name": "case 1.svs", "format": "openslide:aperio",
        "fingerprint": "size:9000 crc32:0a1b2c3d:4e5f6071", "width": 46000, "height": 32914, "mpp_x": 0.499,
        "mpp_y": 0.5, "channels": 3, "level": 0, "level_width": 46000, "level_height": 32914, "downsample": 1.0,
        "tile_size": TILE, "settings": {"level": 0, "tile_size": TILE, "min_tissue": 0.5, "labels": ""},
        "grid": [5750, 4114], "tissue": {"stain": "brightfield", "chosen": "automatic", "median_brightness": 212},
        "tissue_level": 3, "candidates": 7, "done": 7, "tiles": 4, "corrupt_tiles": 1, "unannotated": 2,
        "label_counts": {"0": 3, "1": 1}, "complete": True}
# As stores were written before rgb, fingerprint, name and grid (and with a label of no tiles).
OLD = {"path": "/data/cases/old.svs", "format": "openslide:aperio", "channels": 3, "width": 46000,
       "height": 32914, "level": 0, "level_width": 46000, "level_height": 32914, "downsample": 1.0,
       "tile_size": TILE, "mpp_x": 0.499, "mpp_y": 0.499, "settings": {"level": 0, "tile_size": TILE},
       "candidates": 3, "done": 3, "tiles": 3, "corrupt_tiles": 0, "label_counts": {"0": 3, "1": 0},
       "complete": True}
# A 16-bit multiplex slide tiled at level 1.
MULTIPLEX = {"path": "/slides/panel.ome.tiff", "name": "panel.ome.tiff", "format": "ome-tiff",
             "fingerprint": "size:5 crc32:00000001:00000002", "width": 4001, "height": 3001, "mpp_x": 0.2505,
             "mpp_y": 0.2495, "channels": 5, "rgb": False, "channel_names": ["DAPI", "CD3", "CD8", "panCK", "AF"],
             "sample_bits": 16, "intensity_windows": [[12, 3400], [0, 65535], [7, 900], [100, 20000], [1, 2]],
             "level": 1, "level_width": 2000, "level_height": 1500, "downsample": 2.0005, "tile_size": TILE,
             "settings": {"level": 1, "tile_size": TILE, "intensity_window": [0, 4000]}, "grid": [250, 187],
             "tissue": {"stain": "fluorescence", "chosen": "automatic", "background": 31.5}, "tissue_level": 2,
             "candidates": 6, "done": 6, "tiles": 5, "corrupt_tiles": 1, "unannotated": 0,
             "label_counts": {"0": 2, "2": 3}, "complete": True}


def test_old_entry_reads_with_the_documented_defaults(work):
    record = SlideRecord.from_json(OLD, "old.lmdb: slide 4")
    assert record.name == "old.svs" and record.stem() == "old"  # from the path
    assert record.fingerprint == "" and record.rgb is True  # 3 channels were a colour image
    assert (record.grid_columns, record.grid_rows) == (0, 0)
    assert record.tissue is None and record.tissue_level is None
    assert record.channel_names == [] and record.sample_bits == 8 and record.intensity_windows == []
    assert record.label_counts == [3, 0] and record.class_count() == 1
    again = record.to_json()
    assert not {"grid", "rgb", "tissue", "tissue_level", "channel_names", "sample_bits"} & set(again)
    assert again["fingerprint"] == "" and again["label_counts"] == {"0": 3}
    # Before `rgb`, other than 3 channels were planes; a tile size alone takes every default.
    assert SlideRecord.from_json(dict(OLD, channels=4), "here").rgb is False
    bare = SlideRecord.from_json({"tile_size": 64}, "here")
    assert (bare.channels, bare.rgb, bare.downsample, bare.level, bare.complete) == (3, True, 1.0, 0, False)
    assert bare.settings is None and bare.label_counts == [] and bare.class_count() == 1
    # Null reads as absent, as in tessera.
    assert SlideRecord.from_json(dict(OLD, tissue=None, rgb=None), "here").to_json() == again

    # Through a store: the dataset's slides are these records.
    store = write_store(os.path.join(work, "old.lmdb"), {4: OLD},
                        values_of(grid_tiles(4, record, [0, 0, 0], 1)))
    dataset = TileStoreDataset(store)
    assert dataset.slides == [record]
    assert len(dataset) == 3 and dataset[0]["slide"] == "/data/cases/old.svs" and dataset[0]["image"].shape == (
        TILE, TILE, 3)


MALFORMED = [  # (the change to OLD, or None for text that is not JSON; what follows "STORE: slide 3")
    ({"width": "5"}, ': slide entry: width is "5", not a whole number from 0 to 2147483648'),
    ({"tile_size": -256}, ": slide entry: tile_size is -256, not a whole number from 0 to 65535"),
    ({"label_counts": {"x": 3}}, ": slide entry: label_counts names 'x', not a class index below 65536"),
    ({"label_counts": {"0": 1, "1": 1}}, ": slide entry: label_counts add up to 2, not its 3 tiles"),
    ({"channels": 5, "rgb": True}, ": slide entry: rgb is true for 5 channels"),
    ({"sample_bits": 16, "intensity_windows": [[9, 3]]},
     ": slide entry: intensity_windows holds [9,3], not [low, high] with low < high <= 65535"),
    ({"corrupt_tiles": 1}, ": slide entry: tiles 3, corrupt_tiles 1 and unannotated 0 are more than its 3 candidates"),
    ({"unannotated": 1}, ": slide entry: tiles 3, corrupt_tiles 0 and unannotated 1 are more than its 3 candidates"),
    ({"unannotated": -1}, ": slide entry: unannotated is -1, not a whole number from 0 to 18446744073709551615"),
    # Counts whose sum wraps around 64 bits are still more than the candidates.
    ({"candidates": 2 ** 64 - 1, "tiles": 2 ** 63 + 1, "label_counts": {"0": 2 ** 63 + 1},
      "corrupt_tiles": 2 ** 63 + 1, "unannotated": 2 ** 63 + 1},
     ": slide entry: tiles 9223372036854775809, corrupt_tiles 9223372036854775809 and unannotated "
     "9223372036854775809 are more than its 18446744073709551615 candidates"),
    ({"width": 5.0}, ": slide entry: width is 5.0, not a whole number from 0 to 2147483648"),
    ({"complete": 1}, ": slide entry: complete is not true or false"),
    (None, ": slide entry: not valid JSON: "),
]


def malformed_store(work, index):
    change = MALFORMED[index][0]
    entry = b"{not json" if change is None else json.dumps(dict(OLD, **change)).encode()
    return write_store(os.path.join(work, f"malformed{index}.lmdb"), {3: entry})


@pytest.mark.parametrize("index", range(len(MALFORMED)))
def test_malformed_entry_is_refused_naming_store_slide_and_field(work, index):
    change, message = MALFORMED[index]
    store = malformed_store(work, index)
    with pytest.raises(TileStoreError) as refused:
        TileStoreDataset(store)
    # Text that is not JSON: the parsers' own words follow the same start.
    if change is None:
        assert str(refused.value).startswith(f"{store}: slide 3{message}"), str(refused.value)
        return
    assert str(refused.value) == f"{store}: slide 3{message}"
    if change is not None:
        with pytest.raises(TileStoreError) as refused:
            SlideRecord.from_json(dict(OLD, **change), "here")
        assert str(refused.value) == "here" + message


@pytest.mark.parametrize("index", range(len(MALFORMED)))
def test_malformed_entry_is_refused_alike_by_tessera(work, index):
    store = malformed_store(work, index)
    code, stderr, _ = dump(work, f"malformed{index}", store)
    expected = f"dump_loader: {store}: slide 3{MALFORMED[index][1]}"
    assert code != 0 and (stderr.startswith(expected) if MALFORMED[index][0] is None else stderr == expected + "\n")


# JSON tessera does not read (common/json_input.h): (entry text, how the message goes on).
UNREAD_JSON = [
    (b'{"tile_size": 8, "mpp_x": NaN}', "not valid JSON: "),
    (b'{"tile_size": 8, "path": "\xff"}', "not valid JSON: "),
    (b'{"tile_size": 8, "mpp_x": 1e999}', "not valid JSON: "),
    (b'{"tile_size": 8, "tile_size": 16}', 'JSON refused: the key "tile_size" is given twice in one object'),
    (b'{"tile_size": 8, "settings": ' + b"[" * 65 + b"]" * 65 + b"}", "JSON refused: nested deeper than 64 levels"),
    (b'{"tile_size": 8, "settings": ' + b"[" * 100000 + b"]" * 100000 + b"}",
     "JSON refused: nested deeper than 64 levels"),
]


@pytest.mark.parametrize("index", range(len(UNREAD_JSON)))
def test_json_tessera_does_not_read_is_refused_alike(work, index):
    text, message = UNREAD_JSON[index]
    with pytest.raises(TileStoreError) as refused:
        read_slide_entry(text, "here")
    assert str(refused.value).startswith("here: slide entry: " + message), str(refused.value)
    store = write_store(os.path.join(work, f"unread{index}.lmdb"), {3: text})
    code, stderr, _ = dump(work, f"unread{index}", store)
    assert code != 0 and stderr.startswith(f"dump_loader: {store}: slide 3: slide entry: {message}"), stderr[:1000]
    assert len(stderr) < 400, stderr[:1000]


def test_json_at_tessera_s_limits_is_read():
    nested = b'{"tile_size": 8, "settings": ' + b"[" * 63 + b"]" * 63 + b"}"  # 64 levels, the entry's object one
    assert read_slide_entry(nested, "here").settings == json.loads(nested)["settings"]


def test_python_to_json_equals_tessera_to_json(work):
    rgb, multiplex = SlideRecord.from_json(FULL, "here"), SlideRecord.from_json(MULTIPLEX, "here")
    assert canonical(rgb.to_json()) == canonical(FULL) and canonical(multiplex.to_json()) == canonical(MULTIPLEX)
    # Null fields, a name left out and a default mpp written as a whole number.
    sparse = dict(OLD, name=None, tissue=None, mpp_x=0, label_counts={"0": 3})
    stores = {
        "rgb": write_store(os.path.join(work, "rgb.lmdb"), {0: FULL, 1: OLD, 7: sparse}, {
            **values_of(grid_tiles(0, rgb, [0, 0, 0, 1], 2)),
            **values_of(grid_tiles(1, SlideRecord.from_json(OLD, ""), [0, 0, 0], 3)),
            **values_of(grid_tiles(7, SlideRecord.from_json(sparse, ""), [0, 0, 0], 4))}),
        "multiplex": write_store(os.path.join(work, "multiplex.lmdb"), {2: MULTIPLEX},
                                 values_of(grid_tiles(2, multiplex, [0, 2, 2, 0, 2], 5))),
    }
    compared = 0
    for name, store in stores.items():
        code, stderr, out = dump(work, "records_" + name, store)
        assert code == 0, stderr
        env = lmdb.open(store, readonly=True, max_dbs=2, lock=False)
        with env.begin() as txn:
            raw = {struct.unpack(">I", k)[0]: bytes(v) for k, v in txn.cursor(db=env.open_db(b"slides", txn=txn))}
        env.close()
        assert sorted(line["slide"] for line in out["records"]) == sorted(raw)
        for line in out["records"]:
            ours = read_slide_entry(raw[line["slide"]], f"{store}: slide {line['slide']}").to_json()
            assert canonical(ours) == canonical(line["record"]), (name, line["slide"])
            compared += 1
    assert compared == 4


def test_multiplex_tiles_read_as_height_width_channels(work):
    record = SlideRecord.from_json(MULTIPLEX, "here")
    tiles = grid_tiles(2, record, [0, 2, 2, 0, 2], 6)
    store = write_store(os.path.join(work, "planes.lmdb"), {2: MULTIPLEX}, values_of(tiles))
    dataset = TileStoreDataset(store)
    assert (dataset.channels, dataset.rgb, dataset.tile_size, dataset.class_count) == (5, False, TILE, 3)
    code, stderr, expected = dump(work, "planes", store)
    assert code == 0, stderr
    assert expected["meta"]["channels"] == 5 and len(dataset) == expected["meta"]["count"] == 5
    for index, (key, (_, pixels)) in enumerate(sorted(tiles.items())):
        item = dataset[index]
        assert item["image"].shape == (TILE, TILE, 5) and item["image"].flags.writeable
        assert np.array_equal(item["image"], pixels) and np.array_equal(item["image"], expected["pixels"][index])
        assert item["label"] == expected["labels"][index] and item["slide_index"] == expected["groups"][index]
        assert (item["level"], item["column"]) == (1, struct.unpack(">IIII", key)[3])
        header = expected["tiles"][index]
        assert (item["x"], item["y"], item["label"]) == (header["x"], header["y"], header["label"])
        assert item["x"] == round(item["column"] * TILE * 2.0005)  # level 1, through the record's downsample
    # A JPEG tile holds a colour image, never 5 channels.
    jpeg = tile_value(np.zeros((TILE, TILE, 5), np.uint8), 0, 0, 0, encoding=1)
    with pytest.raises(TileStoreError, match="unsupported tile .channels 5, encoding 1"):
        parse_tile(jpeg, "here")

    # Slides of 5 and of 3 channels do not batch together.
    rgb = write_store(os.path.join(work, "rgb_beside_planes.lmdb"), {0: FULL},
                      values_of(grid_tiles(0, SlideRecord.from_json(FULL, ""), [0, 0, 0, 1], 7)))
    with pytest.raises(TileStoreError, match=r"slide \d has 3 channels \(RGB\), other slides 5 channels|"
                                             r"slide \d has 5 channels, other slides 3 channels \(RGB\)"):
        TileStoreDataset([store, rgb])
    code, stderr, _ = dump(work, "mixed", store, rgb)
    assert code != 0 and "5 channels" in stderr and "3 channels (RGB)" in stderr, stderr
