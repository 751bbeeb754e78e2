"""Reads tessera's LMDB tile stores (``tessera tile --out``) from Python, as a PyTorch ``Dataset``.

Needs numpy, python3-lmdb and PIL (for JPEG tiles); PyTorch only if you use the dataset with
it. Tiles come in tessera's own order (slides by content fingerprint, each slide's tiles by
level, row and column), so index ``i`` here is the patch ``i`` of ``tessera train --data`` on the
same stores, and :meth:`TileStoreDataset.validation_split` holds out the slides that
``--val-fraction`` holds out.

The format (data/tile_format.h): named databases ``tiles`` (16-byte key: slide, level, row,
column as big-endian uint32 -> a 28-byte little-endian header, then the pixels) and ``slides``
(slide id as big-endian uint32 -> the slide's entry as JSON). Every entry is read through
:class:`tessera.slide_record.SlideRecord`, tessera's schema of it (docs/architecture.md,
"Formats", "Slide record"): the same defaults for stores written before a field existed, and a
malformed entry is a TileStoreError naming the store, the slide and the field.

Every failure to read a store is one exception, :class:`TileStoreError`, naming the store and,
where there is one, the slide and the tile; never a signal. A store is refused while a ``tessera
tile`` run holds its lock; before lmdb maps it, its data file is checked against LMDB's meta pages
(a truncated file would be SIGBUS) and its B-trees are walked, so that no page or value lmdb will
touch lies past the file (:mod:`tessera.store_checks`). As tessera does, a dataset refuses slides
that are not completely tiled, a slide whose tiles are not as many as its record lists, no tiles
at all (train and extract refuse that), and, on reading a tile, one whose header (version, byte
count, CRC, size, channels, origin, label) disagrees with its key or its slide's record; and,
where tessera's reader passes over them, tiles of a slide the store does not list.

Changed with SlideRecord: ``TileStoreDataset.slides`` holds SlideRecord objects (attributes:
``record.path``, ``record.tile_size``, ``record.label_counts`` as a list by label), not the raw
JSON dicts (``entry["path"]``); ``record.to_json()`` gives the entry as tessera writes it.
``dataset[i]["slide"]`` is still the slide's path. Tiles of a multiplex slide (other than 3
channels, stored raw) are read as height x width x channels; a dataset refuses stores whose slides
differ in tile size or channels, as tessera does.
"""
import io
import os
import struct
import weakref
import zlib

import lmdb
import numpy as np

from tessera.slide_record import SlideRecord, TileStoreError, read_slide_entry
from tessera.store_checks import check_data_file, check_database, check_not_being_written

try:  # torch is optional: without it the dataset is a plain sequence of samples
    from torch.utils.data import Dataset as _Base
except ImportError:  # pragma: no cover - exercised where torch is missing
    _Base = object

HEADER = struct.Struct("<BBBBHHIIIII")  # version, encoding, channels, zero, width, height, label, x, y, bytes, crc
VERSION = 1
RAW, JPEG = 0, 1
KEY = struct.Struct(">IIII")  # slide, level, row, column

__all__ = ["SlideRecord", "TileStoreDataset", "TileStoreError", "decode_pixels", "find_tile_stores", "is_tile_store",
           "parse_tile"]


def is_tile_store(path):
    """True for an LMDB environment: a directory holding data.mdb, or a name ending in .lmdb."""
    if os.path.isdir(path):
        return os.path.exists(os.path.join(path, "data.mdb"))
    return path.endswith(".lmdb")


def find_tile_stores(paths):
    """The stores that ``paths`` name, as ``tessera train --data`` finds them: a store itself, or a
    directory holding stores (its stores, by name)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    stores = []
    for path in map(os.fspath, paths):
        if is_tile_store(path) or not os.path.isdir(path):
            stores.append(path)
            continue
        try:
            names = os.listdir(path)
        except OSError as error:
            raise TileStoreError(f"{path}: cannot list: {error.strerror}") from None
        inside = sorted(os.path.join(path, name) for name in names if is_tile_store(os.path.join(path, name)))
        if not inside:
            raise TileStoreError(f"{path}: neither a tile store nor a directory holding tile stores")
        stores.extend(inside)
    seen = {}
    for store in stores:
        key = os.path.normpath(os.path.abspath(store))
        if key in seen:
            raise TileStoreError(f"{store} is given twice (as {seen[key]})")
        seen[key] = store
    return stores


def _open_environment(path):
    """(environment, tiles database, slides database, page size) of a store checked as lmdb needs."""
    if not os.path.exists(path):
        raise TileStoreError(f"{path}: no such tile store")
    page_size = check_data_file(path)
    try:
        env = lmdb.open(path, readonly=True, subdir=os.path.isdir(path), max_dbs=2, create=False)
    except lmdb.Error as error:
        raise TileStoreError(f"{path}: not a readable tile store ({error})") from error
    try:
        return env, env.open_db(b"tiles", create=False), env.open_db(b"slides", create=False), page_size
    except lmdb.NotFoundError:
        env.close()
        raise TileStoreError(f"{path}: no `tiles` and `slides` databases (not a tessera tile store)") from None
    except lmdb.Error as error:
        env.close()
        raise TileStoreError(f"{path}: not a readable tile store ({error})") from error


def _read_index(store):
    """(slide id -> SlideRecord, the tiles' keys as rows of slide, level, row, column) of a store,
    read in one transaction; a key, entry or count that is not as tessera writes it is refused."""
    env, tiles_db, slides_db, page_size = _open_environment(store)
    try:
        with env.begin(buffers=True) as txn:
            # Their trees first: lmdb would read a value that a corrupt length runs past the file.
            for name in ("slides", "tiles"):
                check_database(store, page_size, txn.get(name.encode()), name)
            entries = _read_slides(txn, slides_db, store)
            keys = []
            for key in txn.cursor(tiles_db).iternext(keys=True, values=False):
                if len(key) != KEY.size:
                    raise TileStoreError(f"{store}: a tile key has {len(key)} bytes, expected {KEY.size}")
                keys.append(bytes(key))
            counted = txn.stat(tiles_db)["entries"]
    except lmdb.Error as error:
        raise TileStoreError(f"{store}: reading the store: {error} (a corrupt store)") from error
    finally:
        env.close()
    # A zeroed or stale page can read as a short database that LMDB ends without an error.
    if counted != len(keys):
        raise TileStoreError(f"{store}: its tiles database counts {counted} tiles, a walk through it yields "
                             f"{len(keys)} (a corrupt store)")
    rows = np.frombuffer(b"".join(keys), dtype=">u4").astype(np.uint32).reshape(-1, 4)
    unlisted = sorted(set(np.unique(rows[:, 0]).tolist()) - set(entries))
    if unlisted:
        raise TileStoreError(f"{store}: holds tiles of slide {unlisted[0]}, which its slides database does not "
                             "list (a corrupt store)")
    return entries, rows


def _read_slides(txn, slides_db, store):
    entries = {}
    for key, value in txn.cursor(slides_db):
        if len(key) != 4:
            raise TileStoreError(f"{store}: a slide key has {len(key)} bytes")
        slide_id = struct.unpack(">I", key)[0]
        record = read_slide_entry(value, f"{store}: slide {slide_id}")
        if not record.complete:
            raise TileStoreError(f"{store}: slide {slide_id} ({record.path}) is not completely tiled: "
                                 "run the same tessera tile command again to finish it")
        entries[slide_id] = record
    return entries


def parse_tile(value, where):
    """(header fields as a dict, pixel bytes) of one stored value, verified as tessera verifies it."""
    if len(value) < HEADER.size:
        raise TileStoreError(f"{where}: value of {len(value)} bytes is shorter than a tile header")
    version, encoding, channels, _, width, height, label, x, y, size, crc = HEADER.unpack_from(value)
    if version != VERSION:
        raise TileStoreError(f"{where}: tile value version {version} (this reader reads {VERSION})")
    if size != len(value) - HEADER.size:
        raise TileStoreError(f"{where}: header says {size} pixel bytes, value holds {len(value) - HEADER.size}")
    pixels = bytes(value[HEADER.size:])
    if zlib.crc32(pixels, zlib.crc32(bytes(value[:24]))) != crc:
        raise TileStoreError(f"{where}: checksum mismatch (the value is corrupt)")
    # JPEG holds a colour image; a multiplex slide's channels are stored raw, interleaved.
    if channels == 0 or encoding not in (RAW, JPEG) or (encoding == JPEG and channels != 3):
        raise TileStoreError(f"{where}: unsupported tile (channels {channels}, encoding {encoding})")
    return {"encoding": encoding, "channels": channels, "width": width, "height": height, "label": label, "x": x,
            "y": y}, pixels


def decode_pixels(header, pixels, where):
    """The tile as a height x width x channels uint8 array (RGB for 3 channels of a colour image)."""
    shape = (header["height"], header["width"], header["channels"])
    if header["encoding"] == RAW:
        if len(pixels) != shape[0] * shape[1] * shape[2]:
            raise TileStoreError(f"{where}: raw tile has {len(pixels)} bytes, expected "
                                 f"{shape[0] * shape[1] * shape[2]}")
        return np.frombuffer(pixels, np.uint8).reshape(shape).copy()
    from PIL import Image, UnidentifiedImageError  # only JPEG tiles need PIL

    # PIL raises what its decoders raise (OSError, ValueError, SyntaxError, DecompressionBombError,
    # ...) on bytes that are not a good JPEG; each is this tile's error.
    try:
        with Image.open(io.BytesIO(pixels), formats=["JPEG"]) as image:
            if image.size != (shape[1], shape[0]):  # before decoding: the header bounds the work
                raise TileStoreError(f"{where}: JPEG of {image.size[0]}x{image.size[1]}, the header says "
                                     f"{shape[1]}x{shape[0]}")
            image = image.convert("RGB") if image.mode != "RGB" else image
            return np.array(image, dtype=np.uint8)  # writable, as torch wants
    except TileStoreError:
        raise
    except UnidentifiedImageError:
        raise TileStoreError(f"{where}: the tile's bytes are not a JPEG image") from None
    except Exception as error:  # noqa: BLE001 - see above
        raise TileStoreError(f"{where}: the JPEG does not decode ({type(error).__name__}: {error})") from error


# An LMDB environment must not cross a fork (DataLoader workers): datasets close theirs before any
# fork, and each process opens its own on first use.
_reading = weakref.WeakSet()


def _close_before_fork():
    for dataset in list(_reading):
        dataset.close()


os.register_at_fork(before=_close_before_fork)


class TileStoreDataset(_Base):
    """The tiles of one or more tile stores (or directories of them) as labelled samples.

    ``dataset[i]`` is a dict: ``image`` (height x width x 3 uint8 RGB, height x width x channels
    for a multiplex store, or ``transform(image)``), ``label`` (int), ``x`` and ``y`` (the tile's
    top-left corner in level-0 pixels), ``slide`` (the slide's path as tiled), ``slide_index`` (its
    rank in tessera's order), ``level``, ``row`` and ``column`` (the tile's place in its level's
    grid). PyTorch's default collate batches it. ``slides`` holds each slide's SlideRecord by rank;
    ``tile_size``, ``channels`` and ``rgb`` are what every slide's tiles hold.
    Raises TileStoreError naming the store when a slide entry is malformed, a slide is not
    completely tiled, a store is corrupt, slides differ in tile size or channels, or one slide is
    in two stores.
    """

    def __init__(self, paths, transform=None):
        self.stores = find_tile_stores(paths)
        if not self.stores:
            raise TileStoreError("no tile stores given")
        self.transform = transform
        self._environments = {}  # store index -> (environment, tiles, slides), opened on first use
        slides, keys = [], []
        for store_index, store in enumerate(self.stores):
            check_not_being_written(store)
            entries, store_keys = _read_index(store)
            for slide_id, record in entries.items():
                slides.append((record.fingerprint, store_index, slide_id, record))
            keys.append(store_keys)
        slides.sort(key=lambda s: (s[0], s[1], s[2]))
        for previous, slide in zip(slides, slides[1:]):
            if slide[0] and slide[0] == previous[0]:
                raise TileStoreError(f"slide {previous[2]} of {self.stores[previous[1]]} and slide {slide[2]} of "
                                     f"{self.stores[slide[1]]} are the same slide ({slide[0]}): its tiles would "
                                     "count twice")
        self.slides = [record for _, _, _, record in slides]
        self._check_alike(slides)
        first = self.slides[0] if self.slides else SlideRecord()
        self.tile_size, self.channels, self.rgb = first.tile_size, first.channels, first.rgb
        parts = []  # per slide: (store, slide rank, key rows)
        for rank, (_, store_index, slide_id, record) in enumerate(slides):
            rows = keys[store_index][keys[store_index][:, 0] == slide_id]
            if len(rows) != record.tiles:  # a zeroed page can read as a short database
                raise TileStoreError(f"{self.stores[store_index]}: slide {slide_id} ({record.path}) lists "
                                     f"{record.tiles} tiles, the store yields {len(rows)} (a corrupt store)")
            parts.append(np.column_stack([np.full(len(rows), store_index, np.uint32),
                                          np.full(len(rows), rank, np.uint32), rows]))
        # One row per tile: store, slide rank, then its key (slide id, level, row, column).
        self._tiles = np.concatenate(parts) if parts else np.zeros((0, 6), np.uint32)
        if not len(self._tiles):  # as tessera's train and extract refuse it: nothing to read is a fault
            held = f"its {len(self.slides)} slides hold no tiles" if self.slides else \
                "holds no slides (as a tile run leaves a store it was stopped in before its first slide)"
            raise TileStoreError(f"{', '.join(self.stores)}: {held}")
        self.class_count = max((record.class_count() for record in self.slides), default=1)

    def _check_alike(self, slides):
        """One tile size and one kind of channels for all (a batch holds one shape), as tessera."""
        for (_, _, _, previous), (_, store_index, slide_id, record) in zip(slides, slides[1:]):
            where = self.stores[store_index]
            if record.tile_size != previous.tile_size:
                raise TileStoreError(f"{where}: slides with tile sizes {previous.tile_size} and {record.tile_size} "
                                     f"in {', '.join(self.stores)}")
            if (record.channels, record.rgb) != (previous.channels, previous.rgb):
                raise TileStoreError(f"{where}: slide {slide_id} has {_channels_in_words(record)}, other slides "
                                     f"{_channels_in_words(previous)} in {', '.join(self.stores)}")

    def __len__(self):
        return len(self._tiles)

    def _environment(self, store_index):
        if store_index not in self._environments:
            self._environments[store_index] = _open_environment(self.stores[store_index])[:3]
            _reading.add(self)
        return self._environments[store_index]

    def close(self):
        """Closes the stores; the next read opens them again."""
        environments, self._environments = self._environments, {}
        for env, _, _ in environments.values():
            env.close()

    def read(self, index):
        """(header fields, pixel bytes, the tile in messages) of tile ``index``, verified against its
        slide's record as tessera verifies it, but not decoded."""
        store_index, rank, slide_id, level, row, column = (int(v) for v in self._tiles[index])
        env, tiles_db, _ = self._environment(store_index)
        where = f"{self.stores[store_index]} tile slide {slide_id} level {level} row {row} column {column}"
        try:
            with env.begin(buffers=True) as txn:  # a view, copied once (by parse_tile)
                value = txn.get(KEY.pack(slide_id, level, row, column), db=tiles_db)
                if value is None:
                    raise TileStoreError(f"{where}: missing")
                header, pixels = parse_tile(value, where)
        except lmdb.Error as error:
            raise TileStoreError(f"{where}: {error} (a corrupt store)") from error
        record = self.slides[rank]
        if header["width"] != record.tile_size or header["height"] != record.tile_size:
            raise TileStoreError(f"{where}: tile is {header['width']}x{header['height']}, its slide's tile size is "
                                 f"{record.tile_size}")
        if header["channels"] != record.channels:
            raise TileStoreError(f"{where}: tile has {header['channels']} channels, its slide {record.channels}")
        try:
            at = (record.tile_x(column), record.tile_y(row))
        except OverflowError:  # a downsample so large that the place is past any number
            raise TileStoreError(f"{where}: its place in the grid (column {column}, row {row} of {record.tile_size} "
                                 f"pixels, downsample {record.downsample}) is past any level-0 pixel") from None
        if (header["x"], header["y"]) != at:
            raise TileStoreError(f"{where}: tile says it lies at ({header['x']}, {header['y']}), its place in the "
                                 f"grid is ({at[0]}, {at[1]})")
        # A label its slide's record does not count would reach the loss as an out-of-range class.
        counts = record.label_counts
        if header["label"] >= len(counts) or counts[header["label"]] == 0:
            raise TileStoreError(f"{where}: label {header['label']}, a class its slide's label_counts do not list "
                                 f"({len(counts)} classes counted): a corrupt or edited store")
        return header, pixels, where

    def __getitem__(self, index):
        if not -len(self) <= index < len(self):
            raise IndexError(f"tile {index} of {len(self)}")
        index %= len(self)
        header, pixels, where = self.read(index)
        image = decode_pixels(header, pixels, where)
        _, rank, _, level, row, column = (int(v) for v in self._tiles[index])
        return {"image": self.transform(image) if self.transform else image, "label": header["label"],
                "x": header["x"], "y": header["y"], "slide": self.slides[rank].path,
                "slide_index": rank, "level": level, "row": row, "column": column}

    def slide_indices(self):
        """The slide rank of every tile (tessera's groups), as an array."""
        return self._tiles[:, 1].astype(np.int64)

    def validation_split(self, fraction):
        """(train, validation) tile indices as ``tessera train --val-fraction`` splits them: whole
        slides, from the last one backwards, each held out where it brings the held-out tiles
        nearer ``fraction`` of all, training always keeping a slide."""
        groups = self.slide_indices()
        total = len(groups)
        target = fraction * total
        sizes = np.bincount(groups, minlength=len(self.slides))
        held_out, taken = set(), 0
        for rank in range(len(self.slides) - 1, -1, -1):
            size = int(sizes[rank])
            if fraction <= 0 or size == 0 or taken + size >= total:
                continue
            if abs(taken + size - target) < abs(taken - target):
                held_out.add(rank)
                taken += size
        validation = np.isin(groups, list(held_out))
        return np.flatnonzero(~validation), np.flatnonzero(validation)


def _channels_in_words(record):
    """"3 channels (RGB)", "3 channels (planes)", "5 channels", as tessera's messages say it."""
    words = f"{record.channels} channel" + ("" if record.channels == 1 else "s")
    return words + (" (RGB)" if record.rgb else " (planes)") if record.channels == 3 else words
