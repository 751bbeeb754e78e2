"""A slide's entry in a tessera tile store (its ``slides`` database) as one typed record.

The same schema as tessera's ``SlideRecord`` (data/slide_record.h): the same fields, the same
defaults for entries written before a field existed, the same checks (a field of the wrong type or
an impossible value is a :class:`TileStoreError` naming the store, the slide and the field, worded
as tessera words it), and :meth:`SlideRecord.to_json` writes the keys tessera writes. The table of
fields, their JSON types, defaults and checks is docs/architecture.md, "Formats", "Slide record".
"""
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

MAX_CLASSES = 65536  # a label is a class index below this
MAX_PIXELS = 1 << 31  # a side of any slide tessera reads
MAX_CHANNELS = 255  # what a tile header holds
MAX_WHOLE = (1 << 64) - 1  # JSON integers tessera reads as such (larger ones are not whole numbers)


class TileStoreError(ValueError):
    """A store, slide or tile that is missing, incomplete or corrupt; the message names it."""


def _dump(value):
    """A JSON value in a message, compact as tessera (nlohmann::json::dump) writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _whole_number(value):
    """`value` as an int when it is a JSON whole number >= 0 (not a bool, not 5.0), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_WHOLE:
        return value
    return None


def _level0_position(position, downsample):
    """std::llround(position * downsample), as data/slide.h's level0_position (halves away from 0)."""
    magnitude = abs(position * downsample)
    whole = math.floor(magnitude)
    rounded = whole + (magnitude - whole >= 0.5)  # exact: no 0.49999999999999994 + 0.5 rounding up
    return int(rounded) if position * downsample >= 0 else -int(rounded)


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


class _EntryFields:
    """Reads the fields of one entry, each with its default where it is absent (or null), and
    names the field and the entry when one has the wrong type."""

    def __init__(self, entry, where):
        self.entry, self.where = entry, where
        if not isinstance(entry, dict):
            self.fail("the entry", "is not a JSON object")

    def fail(self, name, why):
        raise TileStoreError(f"{self.where}: slide entry: {name} {why}")

    def find(self, name):
        return self.entry.get(name)  # null reads as absent, as in tessera

    def text(self, name, fallback=""):
        value = self.find(name)
        if value is None:
            return fallback
        if not isinstance(value, str):
            self.fail(name, "is not a string")
        return value

    def flag(self, name, fallback):
        value = self.find(name)
        if value is None:
            return fallback
        if not isinstance(value, bool):
            self.fail(name, "is not true or false")
        return value

    def real(self, name, fallback):
        value = self.find(name)
        if value is None:
            return float(fallback)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self.fail(name, "is not a number")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or number < 0:
            self.fail(name, f"is {_dump(value)}, not a finite number >= 0")
        return number

    def count(self, name, fallback, limit=MAX_WHOLE):
        """A whole number in [0, limit]."""
        value = self.find(name)
        if value is None:
            return fallback
        number = _whole_number(value)
        if number is None or number > limit:
            self.fail(name, f"is {_dump(value)}, not a whole number from 0 to {limit}")
        return number


_CLASS_INDEX = re.compile(r"[0-9]+")  # ASCII digits only, as std::from_chars reads them


def _read_label_counts(fields):
    found = fields.find("label_counts")
    if found is None:
        return []
    if not isinstance(found, dict):
        fields.fail("label_counts", "is not an object")
    counts = []
    for label in sorted(found):  # in tessera's order (an object's keys sorted), so a repeat ends alike
        count = found[label]
        if not isinstance(label, str) or not _CLASS_INDEX.fullmatch(label) or int(label) >= MAX_CLASSES:
            fields.fail("label_counts", f"names '{label}', not a class index below {MAX_CLASSES}")
        tiles = _whole_number(count)
        if tiles is None:
            fields.fail("label_counts", f"of {label} is {_dump(count)}")
        index = int(label)
        if index >= len(counts):
            counts.extend([0] * (index + 1 - len(counts)))
        counts[index] = tiles
    return counts


@dataclass
class SlideRecord:
    """One slide of a tile store: the slide, how it is tiled and how far tiling got."""

    # The slide.
    path: str = ""  # absolute, as tiled
    name: str = ""  # its file name
    format: str = ""  # "tiff", "openslide:aperio", ...
    fingerprint: str = ""  # its content; empty in stores tiled before fingerprints
    width: int = 0  # level 0
    height: int = 0
    mpp_x: float = 0.0  # microns per level-0 pixel; 0 when the file does not say
    mpp_y: float = 0.0
    channels: int = 3
    rgb: bool = True  # red, green and blue of a colour image, not a multiplex slide's planes
    channel_names: List[str] = field(default_factory=list)
    sample_bits: int = 8  # 16: planes mapped to 8 bits through...
    intensity_windows: List[Tuple[int, int]] = field(default_factory=list)  # ... one (low, high) a channel
    # How it is tiled: squares of tile_size pixels of `level`.
    level: int = 0
    level_width: int = 0
    level_height: int = 0
    downsample: float = 1.0  # level-0 pixels per pixel of `level`
    tile_size: int = 0
    settings: Any = None  # the tiling settings a resumed run must match
    grid_columns: int = 0
    grid_rows: int = 0
    tissue: Any = None  # how tissue was found
    tissue_level: Optional[int] = None
    candidates: int = 0  # tissue tiles of the grid
    # How far tiling got.
    done: int = 0  # candidates processed
    tiles: int = 0  # tiles stored
    corrupt_tiles: int = 0  # candidates skipped as corrupt
    label_counts: List[int] = field(default_factory=list)  # tiles stored, by label
    complete: bool = False

    def stem(self):
        """The file name without its extension: the name of the slide's feature file."""
        return os.path.splitext(self.name or os.path.basename(self.path))[0]

    def tile_x(self, column):
        """The level-0 x of grid column `column`, as the tile's header records it."""
        return _level0_position(column * self.tile_size, self.downsample)

    def tile_y(self, row):
        return _level0_position(row * self.tile_size, self.downsample)

    def class_count(self):
        """One more than the largest label with tiles (1 when there are none)."""
        return 1 + max((label for label, tiles in enumerate(self.label_counts) if tiles), default=0)

    @classmethod
    def from_json(cls, entry, where):
        """The record of a parsed entry; raises TileStoreError naming `where` ("STORE: slide ID") and
        the field when a field has the wrong type or an impossible value."""
        fields = _EntryFields(entry, where)
        record = cls()
        record.path = fields.text("path")
        record.name = fields.text("name", os.path.basename(record.path))
        record.format = fields.text("format")
        record.fingerprint = fields.text("fingerprint")
        record.width = fields.count("width", 0, MAX_PIXELS)
        record.height = fields.count("height", 0, MAX_PIXELS)
        record.mpp_x = fields.real("mpp_x", 0)
        record.mpp_y = fields.real("mpp_y", 0)
        record.channels = fields.count("channels", 3, MAX_CHANNELS)
        if record.channels == 0:
            fields.fail("channels", "is 0")
        # Stores tiled before `rgb` was recorded held colour images exactly when they had 3 channels.
        record.rgb = fields.flag("rgb", record.channels == 3)
        if record.rgb and record.channels != 3:
            fields.fail("rgb", f"is true for {record.channels} channels")
        names = fields.find("channel_names")
        if names is not None:
            if not isinstance(names, list):
                fields.fail("channel_names", "is not a list")
            for name in names:
                if not isinstance(name, str):
                    fields.fail("channel_names", f"holds {_dump(name)}, not a name")
            record.channel_names = list(names)
        record.sample_bits = fields.count("sample_bits", 8, 16)
        if record.sample_bits not in (8, 16):
            fields.fail("sample_bits", "is neither 8 nor 16")
        windows = fields.find("intensity_windows")
        if windows is not None:
            if not isinstance(windows, list):
                fields.fail("intensity_windows", "is not a list")
            for window in windows:
                low = high = None
                if isinstance(window, list) and len(window) == 2:
                    low, high = _whole_number(window[0]), _whole_number(window[1])
                if low is None or high is None or low >= high or high > 65535:
                    fields.fail("intensity_windows",
                                f"holds {_dump(window)}, not [low, high] with low < high <= 65535")
                record.intensity_windows.append((low, high))
        record.level = fields.count("level", 0, 255)
        record.level_width = fields.count("level_width", 0, MAX_PIXELS)
        record.level_height = fields.count("level_height", 0, MAX_PIXELS)
        record.downsample = fields.real("downsample", 1)
        if not record.downsample >= 1:
            fields.fail("downsample", "is below 1")
        record.tile_size = fields.count("tile_size", 0, 65535)
        if record.tile_size == 0:
            fields.fail("tile_size", "is missing or 0")
        record.settings = fields.find("settings")
        grid = fields.find("grid")
        if grid is not None:
            columns = rows = None
            if isinstance(grid, list) and len(grid) == 2:
                columns, rows = _whole_number(grid[0]), _whole_number(grid[1])
            if columns is None or rows is None or columns > MAX_PIXELS or rows > MAX_PIXELS:
                fields.fail("grid", f"is {_dump(grid)}, not [columns, rows]")
            record.grid_columns, record.grid_rows = columns, rows
        record.tissue = fields.find("tissue")
        if fields.find("tissue_level") is not None:
            record.tissue_level = fields.count("tissue_level", 0, 255)
        record.candidates = fields.count("candidates", 0)
        record.done = fields.count("done", 0)
        record.tiles = fields.count("tiles", 0)
        record.corrupt_tiles = fields.count("corrupt_tiles", 0)
        record.label_counts = _read_label_counts(fields)
        record.complete = fields.flag("complete", False)
        counted = sum(record.label_counts)
        if record.label_counts and counted != record.tiles:
            fields.fail("label_counts", f"add up to {counted}, not its {record.tiles} tiles")
        if fields.find("candidates") is not None and record.tiles + record.corrupt_tiles > record.candidates:
            fields.fail("tiles", f"{record.tiles} and corrupt_tiles {record.corrupt_tiles} are more than its "
                                 f"{record.candidates} candidates")
        if fields.find("candidates") is not None and record.done > record.candidates:
            fields.fail("done", f"is {record.done}, more than its {record.candidates} candidates")
        return record

    def to_json(self):
        """The entry as tessera writes it (a dict for json.dumps)."""
        entry = {"path": self.path, "name": self.name, "format": self.format, "fingerprint": self.fingerprint,
                 "width": self.width, "height": self.height, "mpp_x": float(self.mpp_x),
                 "mpp_y": float(self.mpp_y), "channels": self.channels, "level": self.level,
                 "level_width": self.level_width, "level_height": self.level_height,
                 "downsample": float(self.downsample), "tile_size": self.tile_size, "settings": self.settings,
                 "candidates": self.candidates, "done": self.done, "tiles": self.tiles,
                 "corrupt_tiles": self.corrupt_tiles,
                 "label_counts": {str(label): tiles for label, tiles in enumerate(self.label_counts) if tiles},
                 "complete": self.complete}
        # Written only where they say something, as stores have always had them.
        if self.grid_columns or self.grid_rows:
            entry["grid"] = [self.grid_columns, self.grid_rows]
        if self.tissue is not None:
            entry["tissue"] = self.tissue
        if self.tissue_level is not None:
            entry["tissue_level"] = self.tissue_level
        if self.channel_names:
            entry["channel_names"] = list(self.channel_names)
        if not self.rgb:
            entry["rgb"] = False
        if self.sample_bits != 8:
            entry["sample_bits"] = self.sample_bits
            entry["intensity_windows"] = [[low, high] for low, high in self.intensity_windows]
        return entry


def read_slide_entry(value, where):
    """The SlideRecord of a stored entry (JSON bytes); TileStoreError naming `where` when the bytes
    are not JSON (NaN and Infinity are not: tessera refuses them too) or a field is malformed."""
    try:
        entry = json.loads(bytes(value).decode("utf-8"), parse_constant=_refuse_constant)
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise TileStoreError(f"{where} entry is not JSON") from error
    except RecursionError:  # arrays or objects nested deeper than Python's stack: never an entry
        raise TileStoreError(f"{where}: slide entry: the entry is not a JSON object (nested too deeply)") from None
    return SlideRecord.from_json(entry, where)
