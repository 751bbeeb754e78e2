"""python/tessera/tile_store.py on tile stores made by `tessera tile` and then damaged, as
tests/test_data_store_faults.py does for tessera itself. Each fault is a TileStoreError whose
message names the store (its data file, the slide, the tile): never a signal (the reader runs in a
subprocess, so SIGBUS is seen), never a raw struct, JSON, lmdb, overflow or recursion error. Where
tessera's own reader (tests/dump_loader.cpp) is given the same store, it refuses it too.
- The data file: truncated (to half, by one page, to 100 bytes), a meta page zeroed, the root page
  of each database zeroed, the overflow page of a tile zeroed, and a tile's length in its B-tree
  node made to run 16 MiB past the file (python3-lmdb touches a value's pages before it returns it).
- Tiles: a flipped pixel byte; a header's version, label, origin, width or channels changed with
  its CRC recomputed; a JPEG that is not one; a key of 15 bytes; a tile deleted; a tile of a slide
  the store does not list.
- Slide entries edited to lie: one tile more than stored, a downsample past any coordinate,
  label_counts naming another class, complete false, arrays nested 100,000 deep; a store with no
  slides.
- A store being written: a real `tessera tile` run holding its lock (blocked on LMDB's writer lock
  held here, so the test waits on a state, never a time) is named by pid and host, and finishes
  unharmed; the lock held with flock as tessera holds it; a lock file that no run holds (a killed
  run's) does not stop a read.
"""
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib

import lmdb
import pytest

from data_tools import holds_flock, run, synth, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
DUMP = os.environ.get("TESSERA_DUMP_LOADER", "build/tests/dump_loader")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TILE_FLAGS = ["--size", "64", "--workers", "1"]
PAGE = 4096  # LMDB's page on this machine

# Reads every tile of a store; prints the count, or the exception's type and message. Without
# torch (optional to the reader): importing it would be most of each read's time.
READER = """
import json, sys
sys.modules["torch"] = None
sys.path.insert(0, sys.argv[1])
from tessera.tile_store import TileStoreDataset
try:
    dataset = TileStoreDataset(sys.argv[2])
    for index in range(len(dataset)):
        dataset[index]
    print(json.dumps({"tiles": len(dataset)}))
except Exception as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error)}))
"""


@pytest.fixture(scope="module")
def work():
    path = workdir("test_python_store_faults")
    for index, (width, height) in enumerate([(1536, 1024), (512, 512)]):
        synth(TESSERA, os.path.join(path, f"slide{index}.tiff"), width, height, 70 + index)
    slide = os.path.join(path, "slide0.tiff")
    run(TESSERA, "tile", slide, "--out", os.path.join(path, "raw.lmdb"), "--encoding", "raw", *TILE_FLAGS)
    run(TESSERA, "tile", slide, "--out", os.path.join(path, "jpeg.lmdb"), *TILE_FLAGS)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def read(store):
    """What the Python reader makes of `store`, read in a subprocess: {"tiles": N} or {"error", "message"}."""
    result = subprocess.run([sys.executable, "-c", READER, os.path.join(ROOT, "python"), store],
                            capture_output=True, text=True)
    assert result.returncode >= 0, f"the reader ended by {signal.Signals(-result.returncode).name} on {store}"
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def refused(store, pattern):
    """The reader refuses `store` with a TileStoreError matching `pattern` (whole); its message."""
    outcome = read(store)
    assert outcome.get("error") == "TileStoreError", outcome
    assert re.fullmatch(pattern, outcome["message"]), (pattern, outcome["message"])
    return outcome["message"]


def refused_by_tessera(work, store, words):
    out = os.path.join(work, "dump_" + os.path.basename(store))
    os.makedirs(out, exist_ok=True)
    result = subprocess.run([DUMP, out, "0", store], capture_output=True, text=True)
    assert result.returncode > 0 and words in result.stderr, (words, result.returncode, result.stderr)


def copy(work, name, source="raw.lmdb"):
    store = os.path.join(work, name)
    shutil.rmtree(store, ignore_errors=True)
    shutil.copytree(os.path.join(work, source), store)
    return store


def edit(store, change):
    """Applies `change(txn, tiles, slides)` to `store` with python3-lmdb (LMDB's structure stays sound)."""
    env = lmdb.open(store, max_dbs=2)
    with env.begin(write=True) as txn:
        result = change(txn, env.open_db(b"tiles", txn=txn), env.open_db(b"slides", txn=txn))
    env.close()
    return result


def first_tile(store):
    """The key of the store's first tile: (slide, level, row, column)."""
    env = lmdb.open(store, readonly=True, lock=False, max_dbs=2)
    with env.begin() as txn:
        key = struct.unpack(">IIII", next(iter(txn.cursor(db=env.open_db(b"tiles", txn=txn)).iternext(values=False))))
    env.close()
    return key


def where(store, key):
    return re.escape(f"{store} tile slide {key[0]} level {key[1]} row {key[2]} column {key[3]}")


def database_record(store, name):
    """(depth, root page) of a database, from its record in the main database (lmdb.h's MDB_db)."""
    env = lmdb.open(store, readonly=True, lock=False, max_dbs=2)
    with env.begin() as txn:
        record = bytes(txn.get(name))
    env.close()
    return struct.unpack_from("<H", record, 6)[0], struct.unpack_from("<Q", record, 40)[0]


def first_leaf_node(store):
    """The file offset of the tiles database's first leaf node: down the leftmost branch from its
    root (a page: 16-byte header, u16 node offsets from byte 16; a branch node's child page is its
    first two u16 and its flags as the top word)."""
    depth, page = database_record(store, b"tiles")
    with open(os.path.join(store, "data.mdb"), "rb") as f:
        for level in range(depth):
            f.seek(page * PAGE)
            data = f.read(PAGE)
            node = struct.unpack_from("<H", data, 16)[0]
            if level == depth - 1:
                return page * PAGE + node
            low, high, flags = struct.unpack_from("<HHH", data, node)
            page = low | high << 16 | flags << 32


def patch(store, offset, data):
    with open(os.path.join(store, "data.mdb"), "r+b") as f:
        f.seek(offset)
        f.write(data)


def zero_page(store, page):
    patch(store, page * PAGE, bytes(PAGE))


def truncate(fraction=None, minus=0, to=None):
    def damage(store):
        file = os.path.join(store, "data.mdb")
        size = os.path.getsize(file)
        os.truncate(file, to if to is not None else int(size * fraction) if fraction else size - minus)
    return damage


def zero_root(name):
    return lambda store: zero_page(store, database_record(store, name)[1])


def zero_main_root(store):
    with open(os.path.join(store, "data.mdb"), "rb") as f:
        metas = [f.read(PAGE) for _ in range(2)]
    newer = max(metas, key=lambda meta: struct.unpack_from("<Q", meta, 16 + 128)[0])
    zero_page(store, struct.unpack_from("<Q", newer, 16 + 72 + 40)[0])  # the main database's root


def zero_first_tile_page(store):
    node = first_leaf_node(store)
    with open(os.path.join(store, "data.mdb"), "rb") as f:
        f.seek(node)
        _, _, flags, key_size = struct.unpack("<HHHH", f.read(8))
        assert flags & 1, "the tile is held in overflow pages (F_BIGDATA)"
        f.seek(node + 8 + key_size)
        zero_page(store, struct.unpack("<Q", f.read(8))[0])


def lengthen_first_tile(store):
    node = first_leaf_node(store)
    with open(os.path.join(store, "data.mdb"), "rb") as f:
        f.seek(node + 2)
        high = struct.unpack("<H", f.read(2))[0]
    patch(store, node + 2, struct.pack("<H", high + 0x100))  # 16 MiB more than the value holds


def first_value(mutate, crc=True):
    """Changes the first tile's value; recomputes its CRC (an edit that tessera's CRC cannot see)."""
    def change(txn, tiles, _):
        key, value = next(iter(txn.cursor(db=tiles)))
        value = bytearray(value)
        mutate(value)
        if crc:
            struct.pack_into("<I", value, 24, zlib.crc32(bytes(value[28:]), zlib.crc32(bytes(value[:24]))))
        txn.put(key, bytes(value), db=tiles)
    return lambda store: edit(store, change)


def first_key(change_key, keep=False):
    """Puts the first tile under the key `change_key` makes of its own (none: deleted); `keep`
    keeps it under its own too."""
    def change(txn, tiles, _):
        key, value = next(iter(txn.cursor(db=tiles)))
        value = bytes(value)
        if not keep:
            txn.delete(key, db=tiles)
        new = change_key(bytes(key))
        if new:
            txn.put(new, value, db=tiles)
    return lambda store: edit(store, change)


def entry(change_entry=None, text=None):
    def change(txn, _, slides):
        key, value = next(iter(txn.cursor(db=slides)))
        record = json.loads(bytes(value))
        if change_entry:
            change_entry(record)
        txn.put(key, text if text is not None else json.dumps(record).encode(), db=slides)
    return lambda store: edit(store, change)


def one_tile_more(record):
    record.update(tiles=record["tiles"] + 1, candidates=record["candidates"] + 1, done=record["done"] + 1)
    record["label_counts"]["0"] += 1


def no_slides(store):
    def change(txn, tiles, slides):
        txn.drop(tiles, delete=False)
        txn.drop(slides, delete=False)
    edit(store, change)


SLIDE = r"slide 0 \(.*slide0\.tiff\)"
# (name, damage, the store it damages, the reader's message as a regex of {store}, {data}, {tile};
# words tessera's reader says, None where it reads the store).
FAULTS = [
    ("truncated_half", truncate(0.5), "raw.lmdb", r"{data}: truncated: \d+ bytes, its meta page says \d+ are in use",
     "data.mdb: truncated"),
    ("truncated_page", truncate(minus=PAGE), "raw.lmdb",
     r"{data}: truncated: \d+ bytes, its meta page says \d+ are in use", "data.mdb: truncated"),
    ("truncated_100", truncate(to=100), "raw.lmdb",
     r"{data}: not an LMDB data file, or cut short \(100 bytes, no valid meta pages\)", "no valid meta pages"),
    ("meta_zeroed", lambda store: zero_page(store, 1), "raw.lmdb",
     r"{data}: not an LMDB data file, or cut short \(\d+ bytes, no valid meta pages\)", "no valid meta pages"),
    ("main_root_zeroed", zero_main_root, "raw.lmdb",
     r"{data}: the main database: page \d+ says it is page 0 of kind 0x0, not a leaf \(a corrupt store\)", "{store}"),
    ("tiles_root_zeroed", zero_root(b"tiles"), "raw.lmdb",
     r"{data}: the tiles database: page \d+ says it is page 0 of kind 0x0, not a (leaf|branch) \(a corrupt store\)",
     "reading tiles: MDB_CORRUPTED"),
    ("slides_root_zeroed", zero_root(b"slides"), "raw.lmdb",
     r"{data}: the slides database: page \d+ says it is page 0 of kind 0x0, not a leaf \(a corrupt store\)",
     "reading slides: MDB_CORRUPTED"),
    ("tile_page_zeroed", zero_first_tile_page, "raw.lmdb", r"{tile}: tile value version 0 \(this reader reads 1\)",
     "tile value version 0"),
    ("tile_length_past_file", lengthen_first_tile, "raw.lmdb",
     r"{data}: the tiles database: page \d+ has a value of 16789532 bytes from page \d+, past the file's \d+ bytes "
     r"\(a corrupt store\)", "header says 12288 pixel bytes, value holds 16789504"),
    ("pixel_flipped", first_value(lambda v: v.__setitem__(-1, v[-1] ^ 0x10), crc=False), "raw.lmdb",
     r"{tile}: checksum mismatch \(the value is corrupt\)", "checksum mismatch"),
    ("version_2", first_value(lambda v: v.__setitem__(0, 2)), "raw.lmdb",
     r"{tile}: tile value version 2 \(this reader reads 1\)", "tile value version 2"),
    ("label_7", first_value(lambda v: struct.pack_into("<I", v, 8, 7)), "raw.lmdb",
     r"{tile}: label 7, a class its slide's label_counts do not list \(1 classes counted\): a corrupt or edited store",
     "label 7"),
    ("origin_moved", first_value(lambda v: struct.pack_into("<I", v, 12, 5)), "raw.lmdb",
     r"{tile}: tile says it lies at \(5, \d+\), its place in the grid is \(\d+, \d+\)", "tile says it lies at (5,"),
    ("width_32", first_value(lambda v: struct.pack_into("<H", v, 4, 32)), "raw.lmdb",
     r"{tile}: tile is 32x64, its slide's tile size is 64", "tile is 32x64"),
    ("channels_4", first_value(lambda v: v.__setitem__(2, 4)), "raw.lmdb",
     r"{tile}: tile has 4 channels, its slide 3", "tile has 4 channels"),
    ("not_a_jpeg", first_value(lambda v: v.__setitem__(slice(28, 60), bytes(32))), "jpeg.lmdb",
     r"{tile}: the tile's bytes are not a JPEG image", "{store} tile slide 0"),
    ("key_15_bytes", first_key(lambda key: key[:15]), "raw.lmdb", r"{store}: a tile key has 15 bytes, expected 16",
     "a tile key has 15 bytes"),
    ("tile_deleted", first_key(lambda key: None), "raw.lmdb",
     r"{store}: " + SLIDE + r" lists (\d+) tiles, the store yields (\d+) \(a corrupt store\)", "the store yields"),
    ("tile_of_unlisted_slide", first_key(lambda key: struct.pack(">IIII", 9, 0, 0, 0), keep=True), "raw.lmdb",
     r"{store}: holds tiles of slide 9, which its slides database does not list \(a corrupt store\)", None),
    ("entry_one_tile_more", entry(one_tile_more), "raw.lmdb",
     r"{store}: " + SLIDE + r" lists \d+ tiles, the store yields \d+ \(a corrupt store\)", "the store yields"),
    ("entry_downsample_1e308", entry(lambda record: record.update(downsample=1e308)), "raw.lmdb",
     r"{tile}: its place in the grid \(column \d+, row \d+ of 64 pixels, downsample 1e\+308\) is past any level-0 "
     r"pixel", "its place in the grid"),
    ("entry_label_counts_lie", entry(lambda record: record.update(label_counts={"3": record["tiles"]})), "raw.lmdb",
     r"{tile}: label 0, a class its slide's label_counts do not list \(4 classes counted\): a corrupt or edited store",
     "label 0, a class"),
    ("entry_incomplete", entry(lambda record: record.update(complete=False)), "raw.lmdb",
     r"{store}: " + SLIDE + r" is not completely tiled: run the same tessera tile command again to finish it",
     "is not completely tiled"),
    ("entry_nested", entry(text=b"[" * 100000 + b"]" * 100000), "raw.lmdb",
     r"{store}: slide 0: slide entry: JSON refused: nested deeper than 64 levels", "{store}: slide 0"),
    ("no_slides", no_slides, "raw.lmdb",
     r"{store}: holds no slides \(as a tile run leaves a store it was stopped in before its first slide\)", None),
]


@pytest.mark.parametrize("name, damage, source, pattern, tessera_words", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_one_error_naming_the_store(work, name, damage, source, pattern, tessera_words):
    store = copy(work, name + ".lmdb", source)
    tile = first_tile(store)  # before the damage: lmdb cannot read some damaged stores
    damage(store)
    refused(store, pattern.format(store=re.escape(store), data=re.escape(os.path.join(store, "data.mdb")),
                                  tile=where(store, tile)))
    if tessera_words:
        refused_by_tessera(work, store, tessera_words.format(store=store))
    shutil.rmtree(store)


def test_deleted_tile_counts_are_the_stores(work):
    store = copy(work, "counted.lmdb")
    whole = read(store)["tiles"]
    first_key(lambda key: None)(store)
    message = refused(store, r".* lists (\d+) tiles, the store yields (\d+) \(a corrupt store\)")
    assert re.search(r"lists (\d+) tiles, the store yields (\d+)", message).groups() == (str(whole), str(whole - 1))


def test_store_being_written_by_a_tile_run(work):
    """A real run holds the lock (blocked on LMDB's writer lock, held here); the reader names it by
    pid and host, takes nothing from it, and reads the store once it has ended."""
    store = copy(work, "writing.lmdb")
    before = read(store)["tiles"]
    env = lmdb.open(store, max_dbs=2)
    blocker = env.begin(write=True)
    writer = subprocess.Popen([TESSERA, "tile", os.path.join(work, "slide1.tiff"), "--out", store, "--encoding",
                               "raw", *TILE_FLAGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = os.path.join(work, ".writing.lmdb.lock")
        while not (holds_flock(writer.pid, lock) and os.path.getsize(lock)):  # locked, its record written
            assert writer.poll() is None, writer.communicate()
            time.sleep(0.01)
        message = refused(store, re.escape(store) + r": being written by a tessera run \(pid \d+ on .*\); its slides "
                                                    r"are not all stored yet: read it when that run has ended")
        assert f"pid {writer.pid} on {socket.gethostname()}, since " in message and " tile " in message
    finally:
        blocker.abort()
        env.close()
    _, err = writer.communicate()
    assert writer.returncode == 0, err
    assert not os.path.exists(lock)
    assert read(store)["tiles"] > before


def test_new_store_being_written_before_its_first_slide(work):
    """Before the fix an empty dataset: the run's lock, held with flock as tessera holds it (its
    record names the run), is the error; once it is let go, a store with no slides is one too."""
    store = os.path.join(work, "new.lmdb")
    env = lmdb.open(store, max_dbs=2)  # as `tile` leaves it before its first commit
    with env.begin(write=True) as txn:
        env.open_db(b"tiles", txn=txn)
        env.open_db(b"slides", txn=txn)
    env.close()
    with open(os.path.join(work, ".new.lmdb.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write("pid 4242 on slidehost, since 2025-01-01 09:00:00: tessera tile big.svs --out new.lmdb\n")
        lock.flush()
        refused(store, re.escape(f"{store}: being written by a tessera run (pid 4242 on slidehost, since 2025-01-01 "
                                 "09:00:00: tessera tile big.svs --out new.lmdb); its slides are not all stored yet: "
                                 "read it when that run has ended"))
    refused(store, re.escape(store) + r": holds no slides .*")


def test_lock_file_of_a_killed_run_does_not_stop_a_read(work):
    store = copy(work, "stale.lmdb")
    with open(os.path.join(work, ".stale.lmdb.lock"), "w") as lock:
        lock.write("pid 4243 on slidehost, since 2025-01-01 09:00:00: tessera tile a.svs --out stale.lmdb\n")
    assert read(store) == read(os.path.join(work, "raw.lmdb"))
