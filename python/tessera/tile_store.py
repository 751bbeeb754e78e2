"""Reads tessera's LMDB tile stores (``tessera tile --out``) from Python, as a PyTorch ``Dataset``.

Needs numpy, python3-lmdb and PIL (for JPEG tiles); PyTorch only if you use the dataset with
it. Tiles come in tessera's own order (slides by content fingerprint, each slide's tiles by
level, row and column), so index ``i`` here is the patch ``i`` of ``tessera train --data`` on the
same stores, and :meth:`TileStoreDataset.validation_split` holds out the slides that
``--val-fraction`` holds out.

The format (data/tile_format.h): named databases ``tiles`` (16-byte key: slide, level, row,
column as big-endian uint32 -> a 28-byte little-endian header, then the pixels) and ``slides``
(slide id as big-endian uint32 -> a JSON object).
"""
import io
import json
import os
import struct
import weakref
import zlib

import lmdb
import numpy as np

try:  # torch is optional: without it the dataset is a plain sequence of samples
    from torch.utils.data import Dataset as _Base
except ImportError:  # pragma: no cover - exercised where torch is missing
    _Base = object

HEADER = struct.Struct("<BBBBHHIIIII")  # version, encoding, channels, zero, width, height, label, x, y, bytes, crc
VERSION = 1
RAW, JPEG = 0, 1


class TileStoreError(ValueError):
    """A store, slide or tile that is missing, incomplete or corrupt; the message names it."""


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
        inside = sorted(os.path.join(path, name) for name in os.listdir(path) if is_tile_store(os.path.join(path, name)))
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
    if not os.path.exists(path):
        raise TileStoreError(f"{path}: no such tile store")
    try:
        env = lmdb.open(path, readonly=True, subdir=os.path.isdir(path), max_dbs=2, create=False)
        return env, env.open_db(b"tiles", create=False), env.open_db(b"slides", create=False)
    except lmdb.Error as error:
        raise TileStoreError(f"{path}: not a readable tile store ({error})") from error


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
    if channels != 3 or encoding not in (RAW, JPEG):
        raise TileStoreError(f"{where}: unsupported tile (channels {channels}, encoding {encoding})")
    return {"encoding": encoding, "width": width, "height": height, "label": label, "x": x, "y": y}, pixels


def decode_pixels(header, pixels, where):
    """The tile as a height x width x 3 uint8 RGB array."""
    shape = (header["height"], header["width"], 3)
    if header["encoding"] == RAW:
        if len(pixels) != shape[0] * shape[1] * 3:
            raise TileStoreError(f"{where}: raw tile has {len(pixels)} bytes, expected {shape[0] * shape[1] * 3}")
        return np.frombuffer(pixels, np.uint8).reshape(shape).copy()
    from PIL import Image  # only JPEG tiles need PIL

    try:
        with Image.open(io.BytesIO(pixels)) as image:
            image = image.convert("RGB") if image.mode != "RGB" else image
            rgb = np.array(image, dtype=np.uint8)  # writable, as torch wants
    except (OSError, ValueError) as error:
        raise TileStoreError(f"{where}: {error}") from error
    if rgb.shape != shape:
        raise TileStoreError(f"{where}: JPEG of {rgb.shape[1]}x{rgb.shape[0]}, the header says {shape[1]}x{shape[0]}")
    return rgb


def _key(slide, level, row, column):
    return struct.pack(">IIII", slide, level, row, column)


# An LMDB environment must not cross a fork (DataLoader workers): datasets close theirs before any
# fork, and each process opens its own on first use.
_reading = weakref.WeakSet()


def _close_before_fork():
    for dataset in list(_reading):
        dataset.close()


os.register_at_fork(before=_close_before_fork)


class TileStoreDataset(_Base):
    """The tiles of one or more tile stores (or directories of them) as labelled samples.

    ``dataset[i]`` is a dict: ``image`` (height x width x 3 uint8 RGB, or ``transform(image)``),
    ``label`` (int), ``x`` and ``y`` (the tile's top-left corner in level-0 pixels), ``slide`` (the
    slide's path as tiled), ``slide_index`` (its rank in tessera's order), ``level``, ``row`` and
    ``column`` (the tile's place in its level's grid). PyTorch's default collate batches it.
    Raises TileStoreError naming the store when a slide is not completely tiled, a store is
    corrupt, or one slide is in two stores.
    """

    def __init__(self, paths, transform=None):
        self.stores = find_tile_stores(paths)
        self.transform = transform
        self._environments = {}  # store index -> (environment, tiles, slides), opened on first use
        slides, keys = [], []
        for store_index, store in enumerate(self.stores):
            env, tiles_db, slides_db = _open_environment(store)
            try:
                with env.begin() as txn:
                    listed, entries = self._read_slides(txn, slides_db, store)
                    store_keys = np.array([struct.unpack(">IIII", key) for key in
                                           txn.cursor(tiles_db).iternext(keys=True, values=False)],
                                          dtype=np.uint32).reshape(-1, 4)
            finally:
                env.close()
            if listed and len(store_keys) != listed:
                raise TileStoreError(f"{store}: its slides list {listed} tiles, the tiles database yields "
                                     f"{len(store_keys)} (a corrupt store)")
            for slide_id, entry in entries:
                slides.append((entry.get("fingerprint", ""), store_index, slide_id, entry))
            keys.append(store_keys)
        slides.sort(key=lambda s: (s[0], s[1], s[2]))
        for previous, slide in zip(slides, slides[1:]):
            if slide[0] and slide[0] == previous[0]:
                raise TileStoreError(f"slide {previous[2]} of {self.stores[previous[1]]} and slide {slide[2]} of "
                                     f"{self.stores[slide[1]]} are the same slide ({slide[0]}): its tiles would "
                                     "count twice")
        self.slides = [entry for _, _, _, entry in slides]
        self.tile_size = self.slides[0]["tile_size"] if self.slides else 0
        parts = []  # per slide: (store, slide rank, key rows)
        for rank, (_, store_index, slide_id, _) in enumerate(slides):
            rows = keys[store_index][keys[store_index][:, 0] == slide_id]
            parts.append(np.column_stack([np.full(len(rows), store_index, np.uint32),
                                          np.full(len(rows), rank, np.uint32), rows]))
        # One row per tile: store, slide rank, then its key (slide id, level, row, column).
        self._tiles = np.concatenate(parts) if parts else np.zeros((0, 6), np.uint32)
        counts = [entry.get("label_counts") or {} for entry in self.slides]
        self.class_count = 1 + max([int(label) for c in counts for label, n in c.items() if n > 0], default=0)

    def _read_slides(self, txn, slides_db, store):
        listed, entries = 0, []
        for key, value in txn.cursor(slides_db):
            slide_id = struct.unpack(">I", key)[0]
            entry = json.loads(bytes(value))
            listed += entry.get("tiles", 0)
            if not entry.get("complete", False):
                raise TileStoreError(f"{store}: slide {slide_id} ({entry.get('path', '?')}) is not completely tiled: "
                                     "run the same tessera tile command again to finish it")
            size = entry.get("tile_size", 0)
            if size <= 0:
                raise TileStoreError(f"{store}: slide {slide_id} has no tile_size")
            if entries and size != entries[0][1]["tile_size"]:
                raise TileStoreError(f"{store}: slides with tile sizes {entries[0][1]['tile_size']} and {size}")
            entries.append((slide_id, entry))
        return listed, entries

    def __len__(self):
        return len(self._tiles)

    def _environment(self, store_index):
        if store_index not in self._environments:
            self._environments[store_index] = _open_environment(self.stores[store_index])
            _reading.add(self)
        return self._environments[store_index]

    def close(self):
        """Closes the stores; the next read opens them again."""
        environments, self._environments = self._environments, {}
        for env, _, _ in environments.values():
            env.close()

    def read(self, index):
        """(header fields, pixel bytes) of tile ``index``, verified but not decoded."""
        store_index, _, slide_id, level, row, column = (int(v) for v in self._tiles[index])
        env, tiles_db, _ = self._environment(store_index)
        where = f"{self.stores[store_index]} tile slide {slide_id} level {level} row {row} column {column}"
        with env.begin() as txn:
            value = txn.get(_key(slide_id, level, row, column), db=tiles_db)
            if value is None:
                raise TileStoreError(f"{where}: missing")
            header, pixels = parse_tile(value, where)
        if header["width"] != self.tile_size or header["height"] != self.tile_size:
            raise TileStoreError(f"{where}: tile is {header['width']}x{header['height']}, the store's slides say "
                                 f"{self.tile_size}")
        return header, pixels, where

    def __getitem__(self, index):
        if not -len(self) <= index < len(self):
            raise IndexError(f"tile {index} of {len(self)}")
        index %= len(self)
        header, pixels, where = self.read(index)
        image = decode_pixels(header, pixels, where)
        _, rank, _, level, row, column = (int(v) for v in self._tiles[index])
        return {"image": self.transform(image) if self.transform else image, "label": header["label"],
                "x": header["x"], "y": header["y"], "slide": self.slides[rank].get("path", ""),
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
